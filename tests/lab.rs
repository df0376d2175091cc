//! `syncopate lab` end to end on a real 2-node lab, its bad-input errors, and MPI under mpirun.
//!
//! The lab has namespaces, shaped veths and Open MPI across them; the MPI transport runs under
//! mpirun. Each test says `skipped: …` where the machine cannot run it.

use crate::common::{scratch, stderr, stdout, syncopate};
use std::process::{Command, Output};

/// Why labs cannot be made here, if they cannot.
fn lab_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (labs create network namespaces)".into());
    }
    for tool in ["ip", "tc"] {
        let found = Command::new(tool).arg("-V").output().is_ok();
        if !found {
            return Some(format!("`{tool}` is missing"));
        }
    }
    let netns = Command::new("ip").args(["netns", "list"]).output();
    if !netns.is_ok_and(|o| o.status.success()) {
        return Some("network namespaces are not usable".into());
    }
    None
}

/// Why MPI programs cannot run here, if they cannot.
fn mpi_unavailable() -> Option<String> {
    if !cfg!(feature = "mpi") {
        return Some("built without the `mpi` feature".into());
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        return Some("mpirun is missing (Debian package openmpi-bin)".into());
    }
    None
}

/// A lab name of this test process (several test runs may share the machine).
fn lab_name(tag: &str) -> String {
    format!("{tag}{}", std::process::id() % 10_000_000)
}

/// Objects left by `name`: namespaces, links and the state file.
fn leftovers(name: &str) -> Vec<String> {
    let prefix = format!("{name}-");
    let mut left = Vec::new();
    for args in [&["netns", "list"][..], &["-o", "link", "show"][..]] {
        let out = Command::new("ip").args(args).output().unwrap();
        left.extend(
            stdout(&out)
                .lines()
                .filter(|l| l.contains(&prefix))
                .map(str::to_string),
        );
    }
    let state = format!("/run/syncopate/lab-{name}.json");
    if std::path::Path::new(&state).exists() {
        left.push(state);
    }
    left
}

/// Removes the lab whatever happened to the test (a failed assertion must not leave it).
struct Lab(String);

impl Lab {
    /// The name of this test's lab, or None (saying why) where labs cannot be made.
    fn for_test(tag: &str) -> Option<Lab> {
        if let Some(reason) = lab_unavailable() {
            println!("skipped: {reason}");
            return None;
        }
        Some(Lab(lab_name(tag)))
    }

    /// `lab down`, which must leave nothing of the lab behind.
    fn down(&self) {
        let down = syncopate(&["lab", "down", "--name", &self.0]);
        assert!(down.status.success(), "{}", stderr(&down));
        assert_eq!(leftovers(&self.0), Vec::<String>::new());
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::path::Path::new(&format!("/run/syncopate/lab-{}.json", self.0)).exists() {
            let _ = syncopate(&["lab", "down", "--name", &self.0]);
        }
    }
}

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_syncopate")
}

fn egress_bytes(name: &str) -> Vec<u64> {
    let out = syncopate(&["lab", "status", "--name", name, "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let status: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["egress"]["bytes"].as_u64().unwrap())
        .collect()
}

/// `syncopate lab run --mpi` of the binary's own `lab probe ARGS…` on lab `name`.
fn probe_over_mpi(name: &str, args: &[&str]) -> Output {
    let mut all = vec![
        "lab",
        "run",
        "--name",
        name,
        "--mpi",
        "--timeout-s",
        "120",
        "--",
        exe(),
        "lab",
        "probe",
    ];
    all.extend(args);
    syncopate(&all)
}

fn assert_fails_with(out: &Output, needles: &[&str]) {
    assert_eq!(out.status.code(), Some(1), "{}", stderr(out));
    let text = stderr(out);
    for needle in needles {
        assert!(text.contains(needle), "`{needle}` not in: {text}");
    }
}

#[test]
fn a_two_node_lab_runs_plain_and_mpi_ranks_and_leaves_nothing_behind() {
    let Some(lab) = Lab::for_test("t") else {
        return;
    };
    let name = lab.0.clone();
    let up = syncopate(&[
        "lab",
        "up",
        "--name",
        &name,
        "--nodes",
        "2",
        "--gbps",
        "1",
        "--no-measure",
    ]);
    assert!(up.status.success(), "{}", stderr(&up));
    let again = syncopate(&["lab", "up", "--name", &name, "--nodes", "2", "--gbps", "1"]);
    assert_fails_with(&again, &["exists"]);

    // Plain ranks: torchrun's variables, each rank in its namespace, output prefixed.
    let env = syncopate(&[
        "lab",
        "run",
        "--name",
        &name,
        "--ranks-per-node",
        "2",
        "--",
        "sh",
        "-c",
        "echo \"$RANK/$WORLD_SIZE local $LOCAL_RANK at $MASTER_ADDR:$MASTER_PORT on $GLOO_SOCKET_IFNAME\"; ip -o -4 addr show dev $GLOO_SOCKET_IFNAME",
    ]);
    assert!(env.status.success(), "{}", stderr(&env));
    let text = stdout(&env);
    for rank in 0..4 {
        let node = rank / 2;
        assert!(
            text.contains(&format!(
                "[rank {rank}] {rank}/4 local {} at 198.18.",
                rank % 2
            )),
            "{text}"
        );
        assert!(text.contains(&format!("on {name}-e{node}")), "{text}");
    }
    assert!(text.contains(":29500"), "{text}");

    // The first failure names its rank and status; the others are stopped.
    let fail = syncopate(&[
        "lab",
        "run",
        "--name",
        &name,
        "--timeout-s",
        "60",
        "--",
        "sh",
        "-c",
        "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 50",
    ]);
    assert_fails_with(&fail, &["rank 1", "status 3"]);
    let slow = syncopate(&[
        "lab",
        "run",
        "--name",
        &name,
        "--timeout-s",
        "1",
        "--",
        "sleep",
        "30",
    ]);
    assert_fails_with(&slow, &["timed out after 1.0 s", "rank 0", "rank 1"]);

    match mpi_unavailable() {
        Some(reason) => println!("skipped MPI part: {reason}"),
        None => {
            // The transport's checks across the namespaces.
            let check = probe_over_mpi(&name, &["mpi-check", "--timeout-s", "30"]);
            assert!(check.status.success(), "{}", stderr(&check));
            assert_eq!(
                stdout(&check).matches("ok: ").count(),
                2 * 13,
                "{}",
                stdout(&check)
            );
            // MPI traffic crosses the shaped veths: each rank of a 2-rank ring sends its
            // whole buffer per allreduce (two halves), here twice (a warm-up and one timed).
            let before = egress_bytes(&name);
            let bytes: u64 = 4 << 20;
            let size = bytes.to_string();
            let sweep = probe_over_mpi(
                &name,
                &[
                    "sweep",
                    "--op",
                    "allreduce",
                    "--sizes",
                    &size,
                    "--repeats",
                    "1",
                    "--timeout-s",
                    "60",
                ],
            );
            assert!(sweep.status.success(), "{}", stderr(&sweep));
            let after = egress_bytes(&name);
            for (node, (b, a)) in before.iter().zip(&after).enumerate() {
                assert!(
                    a - b >= 2 * bytes,
                    "node {node}'s shaper passed {} bytes for a {bytes}-byte allreduce run twice",
                    a - b
                );
            }
            // A rank that dies: the run fails naming it, and does not hang.
            let killed = probe_over_mpi(
                &name,
                &["mpi-check", "--timeout-s", "10", "--kill-rank", "1"],
            );
            assert_fails_with(&killed, &["rank 1"]);
        }
    }

    lab.down();
    let twice = syncopate(&["lab", "down", "--name", &name]);
    assert_fails_with(&twice, &["no such lab"]);
}

#[test]
fn lab_up_measures_its_network_into_a_cluster_the_simulator_loads() {
    let Some(lab) = Lab::for_test("m") else {
        return;
    };
    let name = lab.0.clone();
    let dir = scratch("lab-measure");
    let cluster = dir.join("cluster.json");
    let cluster = cluster.to_str().unwrap();
    let up = syncopate(&[
        "lab",
        "up",
        "--name",
        &name,
        "--nodes",
        "2",
        "--gbps",
        "0.5",
        "--measure-s",
        "0.5",
        "--repeats",
        "1",
        "--cluster-out",
        cluster,
        "--format",
        "json",
    ]);
    assert!(up.status.success(), "{}", stderr(&up));
    let report: serde_json::Value = serde_json::from_str(&stdout(&up)).unwrap();
    let goodput = report["measurements"]["network"]["goodput_gbps"]
        .as_f64()
        .unwrap();
    // A shaped link carries at most its rate, and TCP gets most of it.
    assert!(goodput > 0.2 && goodput <= 0.5 * 1.05, "{goodput}");
    for op in ["allreduce", "allgather"] {
        assert_eq!(
            report["measurements"][op].as_array().unwrap().is_empty(),
            !cfg!(feature = "mpi"),
            "{op}"
        );
    }
    let predicted = syncopate(&[
        "collective",
        "--cluster",
        cluster,
        "--bytes",
        "1M",
        "--format",
        "json",
    ]);
    assert!(predicted.status.success(), "{}", stderr(&predicted));
    // Both sweeps stand in for the model on this lab: the allreduces and the allgathers.
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cluster).unwrap()).unwrap();
    let swept: Vec<&str> = written["library"]["measured"]
        .as_array()
        .map(|m| m.iter().filter_map(|s| s["op"].as_str()).collect())
        .unwrap_or_default();
    let expected: &[&str] = match cfg!(feature = "mpi") {
        true => &["allreduce", "allgather"],
        false => &[],
    };
    assert_eq!(swept, expected);
    lab.down();
}

#[test]
fn bad_lab_input_is_a_clear_error_and_leaves_nothing_behind() {
    let Some(lab) = Lab::for_test("b") else {
        return;
    };
    let name = lab.0.clone();
    for (args, needles) in [
        (vec!["--nodes", "2", "--gbps", "0"], vec!["--gbps", "0"]),
        (vec!["--nodes", "2", "--gbps", "-1"], vec!["--gbps"]),
        (vec!["--nodes", "2", "--gbps", "NaN"], vec!["--gbps", "NaN"]),
        (vec!["--nodes", "2", "--gbps", "1e12"], vec!["--gbps"]),
        (vec!["--nodes", "1", "--gbps", "1"], vec!["--nodes", "2 to"]),
        (
            vec!["--nodes", "1000", "--gbps", "1"],
            vec!["--nodes", "usable CPUs"],
        ),
        (
            vec!["--nodes", "2", "--gbps", "1", "--cores-per-node", "0"],
            vec!["--cores-per-node"],
        ),
        (
            vec!["--nodes", "2", "--gbps", "1", "--latency-us", "-5"],
            vec!["--latency-us"],
        ),
        (
            vec!["--nodes", "2", "--gbps", "1", "--burst-bytes", "10"],
            vec!["--burst-bytes"],
        ),
        (
            vec!["--nodes", "2", "--gbps", "1", "--measure-s", "0"],
            vec!["--measure-s"],
        ),
    ] {
        let mut all = vec!["lab", "up", "--name", name.as_str(), "--no-measure"];
        all.extend(args.iter().copied());
        let out = syncopate(&all);
        assert_fails_with(&out, &needles);
        assert_eq!(leftovers(&name), Vec::<String>::new(), "after {args:?}");
    }
    let bad_name = syncopate(&[
        "lab", "up", "--name", "Bad-Name", "--nodes", "2", "--gbps", "1",
    ]);
    assert_fails_with(&bad_name, &["--name", "Bad-Name"]);
    // Added delay needs netem: a kernel without it says so and makes nothing; one with it
    // makes the lab.
    let delayed = syncopate(&[
        "lab",
        "up",
        "--name",
        &name,
        "--nodes",
        "2",
        "--gbps",
        "1",
        "--latency-us",
        "100",
        "--no-measure",
    ]);
    if delayed.status.success() {
        lab.down();
    } else {
        assert_fails_with(&delayed, &["--latency-us", "netem"]);
    }
    assert_eq!(leftovers(&name), Vec::<String>::new());
    for command in ["down", "status"] {
        let out = syncopate(&["lab", command, "--name", &name]);
        assert_fails_with(&out, &["no such lab"]);
    }
    let run = syncopate(&["lab", "run", "--name", &name, "--", "true"]);
    assert_fails_with(&run, &["no such lab"]);
}

#[test]
fn the_mpi_transport_matches_the_host_mesh_on_three_ranks() {
    if let Some(reason) = mpi_unavailable() {
        println!("skipped: {reason}");
        return;
    }
    let out = mpirun("3", &["lab", "probe", "mpi-check", "--timeout-s", "30"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(
        stdout(&out).matches("ok: ").count(),
        3 * 13,
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("within 2(p−1)·u·Σ|x| of the host ring on 3 ranks"));
}

/// The hierarchical allreduce and CaSync-Ring over MPI between processes, as on the host.
#[test]
fn mpi_exec_runs_hierarchical_and_compressed_rings_across_nodes() {
    if let Some(reason) = mpi_unavailable() {
        println!("skipped: {reason}");
        return;
    }
    crate::runtime::rings_across_nodes("mpi", 2, |args| mpirun("4", args));
}

/// ZeRO, FSDP and HSDP plans over MPI between processes, checked as on the host.
#[test]
fn mpi_exec_checks_sharded_plans() {
    if let Some(reason) = mpi_unavailable() {
        println!("skipped: {reason}");
        return;
    }
    crate::runtime::sharded_plans_checked("mpi", |args, ranks| mpirun(ranks, args));
}

/// This binary with `args` as `ranks` MPI processes on this machine, over TCP.
fn mpirun(ranks: &str, args: &[&str]) -> Output {
    let launch = [
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        ranks,
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl",
        "tcp,self",
        exe(),
    ];
    Command::new("mpirun")
        .args(launch)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn mpi_programs_outside_a_launch_say_how_to_start_them() {
    if !cfg!(feature = "mpi") {
        println!("skipped: built without the `mpi` feature");
        return;
    }
    let out = syncopate(&["lab", "probe", "mpi-check"]);
    assert_fails_with(&out, &["not started by an MPI launcher", "mpirun"]);
}

#[test]
fn a_sweep_of_an_operation_it_cannot_time_names_the_flag_before_mpi_starts() {
    for (op, needles) in [
        (
            "broadcast",
            vec!["--op", "broadcast", "allreduce or allgather"],
        ),
        ("gather-all", vec!["--op", "gather-all"]),
    ] {
        let out = syncopate(&[
            "lab",
            "probe",
            "sweep",
            "--op",
            op,
            "--sizes",
            "4096",
            "--repeats",
            "1",
            "--timeout-s",
            "5",
        ]);
        assert_fails_with(&out, &needles);
    }
}
