//! The command line end to end: outputs, exit codes and error messages.

use crate::common::{stderr, stdout, syncopate};

#[test]
fn collective_text_table_looks_like_nccl_tests() {
    let out = syncopate(&[
        "collective",
        "--cluster",
        "dgx-h100",
        "--op",
        "allreduce",
        "--bytes",
        "4K,1M,1G",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("busbw") && text.contains("algbw"), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .count(),
        3
    );
}

#[test]
fn collective_json_has_the_documented_keys() {
    let out = syncopate(&[
        "collective",
        "--cluster",
        "v100-10gbe",
        "--nodes",
        "2",
        "--op",
        "allgather",
        "--bytes",
        "1M,64M",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for key in [
        "bytes",
        "time_us",
        "algbw_gbps",
        "busbw_gbps",
        "algorithm",
        "protocol",
    ] {
        assert!(rows[0].get(key).is_some(), "missing {key}");
    }
    assert_eq!(rows[1]["bytes"], 64 << 20);
}

#[test]
fn every_operation_runs_on_every_cluster() {
    for cluster in ["dgx1-v100", "v100-tcp", "dgx-h100", "v100-pcie-25gbe"] {
        for op in [
            "allreduce",
            "allgather",
            "reduce-scatter",
            "broadcast",
            "reduce",
            "alltoall",
        ] {
            let out = syncopate(&[
                "collective",
                "--cluster",
                cluster,
                "--op",
                op,
                "--bytes",
                "4K,256M",
            ]);
            assert!(out.status.success(), "{cluster} {op}: {}", stderr(&out));
        }
    }
}

#[test]
fn compare_prints_the_error_table() {
    let data = crate::common::validation_data("echo_nccl_allreduce_a100_ib200.csv");
    let out = syncopate(&[
        "collective",
        "--cluster",
        "a100-ib200",
        "--compare",
        data.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["error_by_gpus"].as_array().unwrap().len(), 6);
}

#[test]
fn list_commands_print_shipped_names() {
    let out = syncopate(&["list", "clusters"]);
    assert!(out.status.success());
    for name in [
        "dgx1-v100",
        "v100-pcie",
        "v100-10gbe",
        "v100-100gib",
        "v100-nvlink-100gbe",
        "v100-pcie-25gbe",
        "v100-tcp",
        "a100-ib200",
        "dgx-a100",
        "dgx-h100",
    ] {
        assert!(stdout(&out).contains(name), "{name}");
    }
    let out = syncopate(&["list", "models"]);
    assert!(stdout(&out).contains("bert-large"));
    for what in ["devices", "compressors", "strategies"] {
        assert!(syncopate(&["list", what]).status.success(), "{what}");
    }
}

#[test]
fn bad_input_exits_non_zero_with_a_clear_message() {
    let cases: [(&[&str], &str); 7] = [
        (&["collective", "--cluster", "dgx-z100"], "valid clusters"),
        (
            &["collective", "--cluster", "dgx-h100", "--inter-gbps", "0"],
            "--inter-gbps",
        ),
        (
            &["collective", "--cluster", "dgx-h100", "--inter-gbps", "-5"],
            "--inter-gbps",
        ),
        (
            &["collective", "--cluster", "dgx-h100", "--nodes", "0"],
            "--nodes",
        ),
        (
            &[
                "collective",
                "--cluster",
                "dgx-h100",
                "--gpus-per-node",
                "0",
            ],
            "--gpus-per-node",
        ),
        (
            &["collective", "--cluster", "dgx-h100", "--bytes", "12Q"],
            "byte size",
        ),
        (
            &["collective", "--cluster", "dgx-h100", "--op", "allscatter"],
            "valid operations",
        ),
    ];
    for (args, expected) in cases {
        let out = syncopate(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(!stderr(&out).contains("panicked"), "{args:?}");
    }
}

#[test]
fn missing_file_and_usage_errors_have_their_exit_codes() {
    let out = syncopate(&["collective", "--cluster", "no/such/cluster.json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no/such/cluster.json"));
    let out = syncopate(&["collective"]);
    assert_eq!(out.status.code(), Some(2), "usage errors exit 2");
}
