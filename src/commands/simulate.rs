//! `syncopate simulate`: a model on a cluster under a strategy or plan, summarized.

use super::shared::plan_file::{load_plan, plan_cluster, plan_model};
use super::shared::plan_target;
use crate::cli::{Format, SchemeArg, SimulateArgs};
use anyhow::Context;
use syncopate_sim::base::data::DataKind;
use syncopate_sim::codec::CodecSet;
use syncopate_sim::inputs::device::DeviceProfile;
use syncopate_sim::inputs::framework::Framework;
use syncopate_sim::inputs::model::ModelProfile;
use syncopate_sim::inputs::topology::{Cluster, ClusterOverrides};
use syncopate_sim::plan::Plan;
use syncopate_sim::predict::memory::{gib, MemoryUse};
use syncopate_sim::predict::noise::NoiseSpec;
use syncopate_sim::predict::scenario::Scenario;
use syncopate_sim::predict::simulate::{check_float8_device, simulate, SimOptions};
use syncopate_sim::predict::summary::Summary;
use syncopate_sim::sharding::{ParamDtype, MAX_PREFETCH};
use syncopate_sim::strategy::{ShardOptions, Strategy, StrategyOptions};
use syncopate_sim::{base::limits, SimError};

pub fn run(args: &SimulateArgs) -> anyhow::Result<()> {
    // A plan brings its model and cluster; a strategy run names them.
    let (loaded, model_name, cluster_name, overrides) = match &args.plan {
        Some(path) => {
            let (plan, model) = load_plan(path, args.model.as_deref())?;
            let (cluster, overrides) = plan_cluster(&args.cluster, &plan)?;
            let name = plan_model(&plan, args.model.as_deref());
            let label = path.to_string_lossy().into_owned();
            (Some((plan, model, label)), name, cluster, overrides)
        }
        None => {
            let overrides = ClusterOverrides {
                nodes: args.cluster.nodes,
                gpus_per_node: args.cluster.gpus_per_node,
                inter_gbps: args.cluster.inter_gbps,
            };
            let cluster = required("--cluster", &args.cluster.cluster)?;
            (None, required("--model", &args.model)?, cluster, overrides)
        }
    };
    let cluster = Cluster::load(&cluster_name, overrides)?;
    let (plan_and_label, model) = match loaded {
        Some((plan, model, label)) => (Some((plan, label)), model),
        None => (None, ModelProfile::load(&model_name)?),
    };
    let model = match args.batch_size {
        Some(batch) => model.at_batch(batch, "--batch-size")?,
        None => model,
    };
    let mut base = Scenario::new(model, cluster)?;
    if let Some(host) = &args.cpu_compression {
        base = base.with_host_codec(DeviceProfile::load(host)?)?;
    }
    // A loaded plan, or the strategy that plans.
    let (source, label) = match plan_and_label {
        Some((plan, label)) => (Source::Loaded(Box::new(plan)), label),
        None => {
            let strategy: Strategy = args.strategy.parse()?;
            (Source::Strategy(strategy), format!("strategy {strategy}"))
        }
    };
    // The framework that runs the plan (the flag's, else the plan's, else the strategy's) and
    // the codecs that compress it (the flag's, else the plan's) are set before the strategy
    // plans, so that it plans under the costs the plan is then priced with.
    let (plan_framework, plan_codecs) = match &source {
        Source::Loaded(plan) => (plan.framework.clone(), plan.codecs.clone()),
        Source::Strategy(strategy) => (strategy.framework().map(str::to_string), None),
    };
    let framework = match chosen(
        ("--framework", args.framework.as_deref()),
        ("framework", plan_framework.as_deref()),
        &label,
    ) {
        Some((name, context)) => Framework::named(name).context(context)?,
        None => None,
    };
    let framework_name = framework.as_ref().map(|(name, _)| name.clone());
    let base = base.with_framework(framework.map(|(_, framework)| framework));
    let (codecs, context) = match chosen(
        ("--codecs", args.codecs.as_deref()),
        ("codecs", plan_codecs.as_deref()),
        &label,
    ) {
        Some((name, context)) => (CodecSet::named(name).context(context.clone())?, context),
        None => (None, String::new()),
    };
    let codecs_name = codecs.as_ref().map(|(name, _)| name.clone());
    let base = base
        .with_codecs(codecs.map(|(_, set)| set))
        .context(context.clone())?;
    let mut plan = match source {
        Source::Loaded(plan) => *plan,
        Source::Strategy(strategy) => {
            let calls = args.codec_calls.codec_calls();
            strategy.check_codec_calls(calls, "--codec-calls")?;
            let mut plan = strategy.plan(&base, &strategy_options(args)?)?;
            refuse_unsharded_flags(args, &plan)?;
            // `auto` leaves the strategy's own schemes (DeAR's split, HiPress's rings) alone.
            if args.scheme != SchemeArg::Auto {
                plan.set_scheme(args.scheme.scheme());
            }
            plan.wire = args.wire.wire();
            plan.codec_calls = calls;
            plan
        }
    };
    if let Some(set) = &base.codecs {
        set.check_plan(&plan).context(context)?;
    }
    plan.framework = framework_name;
    plan.codecs = codecs_name;
    if let Some(streams) = args.comm_streams {
        plan.policy.comm_streams = comm_streams("--comm-streams", streams)?;
    }
    plan.validate(&label, &base.model)
        .map_err(|err| match (&args.plan, err) {
            // A strategy's plan that the flags cannot run: the user typed flags, not fields.
            (None, SimError::Invalid { field, message, .. }) if field == "codec_calls" => {
                SimError::bad_value("--codec-calls", "tensor", message)
            }
            (None, SimError::Invalid { field, message, .. }) if field == "sharding.param_dtype" => {
                SimError::bad_value(
                    "--param-dtype",
                    args.param_dtype.param_dtype().name(),
                    message,
                )
            }
            (None, SimError::Invalid { field, message, .. })
                if field == "sharding.secondary_within_node" =>
            {
                SimError::bad_value("--hpz", "set", message)
            }
            (None, SimError::Invalid { field, message, .. })
                if field == "sharding.float8_all_gather" =>
            {
                SimError::bad_value("--float8-all-gather", "set", message)
            }
            (None, SimError::Invalid { message, .. }) => SimError::bad_value(
                "--compressor",
                &args.compressor,
                format!("the `{}` strategy cannot use it: {message}", args.strategy),
            ),
            (_, err) => err,
        })?;
    // A device without float8 products, named by the flag the user typed.
    check_float8_device(&base, &plan).map_err(|err| match (&args.plan, err) {
        (None, SimError::Invalid { message, .. }) => {
            SimError::bad_value("--float8-all-gather", "set", message)
        }
        (_, err) => err,
    })?;
    if let Some(path) = &args.save_plan {
        plan.target = Some(plan_target::target(
            &model_name,
            &cluster_name,
            overrides.inter_gbps,
            &base.cluster,
            args.cpu_compression.as_deref(),
        ));
        let text = serde_json::to_string_pretty(&plan)? + "\n";
        super::write_atomically(path, &text)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let options = SimOptions {
        warmup: args.warmup,
        iterations: args.iterations,
        noise: noise(args)?,
        force_explicit: args.explicit,
        trace_ranks: if args.trace.is_some() {
            args.trace_ranks.max(1)
        } else {
            0
        },
    };
    let outcome = simulate(&base, &plan, &options)?;
    if let (Some(path), Some(trace)) = (&args.trace, &outcome.trace) {
        let text = serde_json::to_string(trace)?;
        super::write_atomically(path, &text)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    match args.format {
        Format::Json => super::print_json(&outcome.summary),
        Format::Text => {
            print_summary(&outcome.summary, &base, &plan);
            Ok(())
        }
    }
}

/// The data file a flag names, else the one the plan (or strategy, `label`) names, with how an
/// error about it names its source: the flag and its value, or the plan's field.
fn chosen<'a>(
    (flag, flagged): (&str, Option<&'a str>),
    (field, planned): (&str, Option<&'a str>),
    label: &str,
) -> Option<(&'a str, String)> {
    match (flagged, planned) {
        (Some(name), _) => Some((name, format!("{flag} {name}"))),
        (None, Some(name)) => Some((name, format!("{label}: `{field}`"))),
        (None, None) => None,
    }
}

/// A flag a strategy run needs (a plan brings its own model and cluster).
fn required(flag: &str, value: &Option<String>) -> Result<String, SimError> {
    value.clone().ok_or_else(|| {
        SimError::bad_value(
            flag,
            "(none)",
            "required unless --plan names a plan that records it",
        )
    })
}

/// A count of communication streams (or partitions in flight) within the plan limit.
fn comm_streams(flag: &str, streams: u32) -> Result<u32, SimError> {
    if streams <= limits::MAX_COMM_STREAMS {
        Ok(streams)
    } else {
        Err(SimError::bad_value(
            flag,
            streams,
            format!("at most {} communication streams", limits::MAX_COMM_STREAMS),
        ))
    }
}

/// Units a gather may run ahead, within the plan limit.
fn prefetch(units: u32) -> Result<u32, SimError> {
    match units <= MAX_PREFETCH {
        true => Ok(units),
        false => Err(SimError::bad_value(
            "--prefetch",
            units,
            format!("at most {MAX_PREFETCH} units ahead"),
        )),
    }
}

/// Most elements a ZeRO bucket may hold: far above any model's, well within checked sizes.
const MAX_BUCKET_ELEMENTS: f64 = 1e15;

/// `--reduce-bucket-size`: a whole number of elements, DeepSpeed's `reduce_bucket_size`.
fn bucket_elements(elements: f64) -> Result<u64, SimError> {
    if (1.0..=MAX_BUCKET_ELEMENTS).contains(&elements) && elements.fract() == 0.0 {
        Ok(elements as u64)
    } else {
        Err(SimError::bad_value(
            "--reduce-bucket-size",
            elements,
            "a whole number of elements from 1 to 1e15",
        ))
    }
}

/// An error naming the sharding flag a replicated strategy's plan would silently leave out.
fn refuse_unsharded_flags(args: &SimulateArgs, plan: &Plan) -> Result<(), SimError> {
    if plan.sharding.is_some() {
        return Ok(());
    }
    let param_dtype = args.param_dtype.param_dtype();
    let (flag, value) = match (args.hpz, args.float8_all_gather, param_dtype) {
        (true, _, _) => ("--hpz", "set"),
        (_, true, _) => ("--float8-all-gather", "set"),
        (false, false, ParamDtype::Fp32) => return Ok(()),
        (false, false, dtype) => ("--param-dtype", dtype.name()),
    };
    Err(SimError::bad_value(
        flag,
        value,
        format!(
            "the `{}` strategy keeps the parameters whole on every rank: it shards with zero1, zero2, fsdp or hsdp",
            args.strategy
        ),
    ))
}

fn strategy_options(args: &SimulateArgs) -> anyhow::Result<StrategyOptions> {
    Ok(StrategyOptions {
        fusion_bytes: limits::mib("--fusion-mb", args.fusion_mb)?,
        cycle_us: limits::flag_duration_us("--cycle-ms", args.cycle_ms, args.cycle_ms * 1e3)?,
        bucket_bytes: limits::mib("--bucket-mb", args.bucket_mb)?,
        first_bucket_bytes: limits::mib("--first-bucket-mb", args.first_bucket_mb)?,
        partition_bytes: limits::mib("--partition-mb", args.partition_mb)?,
        credit: comm_streams("--credit", args.credit)?,
        ps_servers: args.ps_servers,
        sharding: ShardOptions {
            prefetch: prefetch(args.prefetch)?,
            reshard_after_forward: args.reshard_after_forward,
            param_dtype: args.param_dtype.param_dtype(),
            blocks_per_unit: args.blocks_per_unit,
            bucket_elements: bucket_elements(args.reduce_bucket_size)?,
            secondary_within_node: args.hpz,
            float8_all_gather: args.float8_all_gather,
        },
        compressor: args.compressor.parse()?,
        memory: args.memory.parse()?,
    })
}

fn noise(args: &SimulateArgs) -> anyhow::Result<NoiseSpec> {
    let (probability, slowdown) = match &args.straggler {
        None => (0.0, 1.0),
        Some(text) => {
            let bad = || {
                SimError::bad_value(
                    "--straggler",
                    text,
                    "expected PROBABILITY,SLOWDOWN, e.g. 0.01,2",
                )
            };
            let (p, s) = text.split_once(',').ok_or_else(bad)?;
            (
                p.trim().parse().map_err(|_| bad())?,
                s.trim().parse().map_err(|_| bad())?,
            )
        }
    };
    let spec = NoiseSpec {
        jitter_cv: args.jitter,
        straggler_probability: probability,
        straggler_slowdown: slowdown,
        // The model profile's measured skew joins in `simulate`.
        rank_skew_cv: 0.0,
        seed: args.seed,
    };
    spec.validate()?;
    Ok(spec)
}

fn print_memory(m: &MemoryUse) {
    let optimizer = m
        .optimizer_bytes
        .map_or("not in the profile".to_string(), |b| {
            format!("{:.2}", gib(b))
        });
    let capacity = match m.capacity_bytes {
        Some(capacity) if m.fits() => format!(" of {:.0} GiB", gib(capacity)),
        Some(capacity) => format!(" of {:.0} GiB: DOES NOT FIT", gib(capacity)),
        None => String::new(),
    };
    let activations = match m.activation_bytes {
        Some(bytes) => format!("model states and {:.2} GiB of activations", gib(bytes)),
        None => "model states; activations not in the profile".to_string(),
    };
    println!(
        "  memory per rank     {:>12.2} GiB{capacity} ({activations})",
        gib(m.total_bytes())
    );
    println!(
        "    parameters {:.2}, gradients {:.2}, optimizer {optimizer}, gathered {:.2}, error feedback {:.2} GiB",
        gib(m.parameters_bytes),
        gib(m.gradients_bytes),
        gib(m.gathered_bytes),
        gib(m.compression_bytes)
    );
}

fn print_summary(s: &Summary, scenario: &Scenario, plan: &Plan) {
    let framework = match (&s.framework, &s.codecs) {
        (Some(name), Some(codecs)) => format!(", run by {name} with {codecs}'s codecs"),
        (Some(name), None) => format!(", run by {name}"),
        (None, _) => String::new(),
    };
    println!(
        "{} on {} ({} GPUs, {} path), strategy {}{framework}",
        s.model, s.cluster, s.world_size, s.path, s.strategy
    );
    println!("  iteration time      {:>12.3} ms", s.iteration_time_ms);
    println!(
        "  throughput          {:>12.1} {}/s",
        s.throughput_samples_per_s, scenario.model.sample_unit
    );
    // One GPU runs forward, backward and the optimizer step one after another; a plan that
    // updates each group just before its next forward overlaps them, and can beat it.
    let above = if s.scaling_efficiency > 1.0 && plan.policy.overlap_forward {
        "; above 100 %: each group's update overlaps the next forward, which one GPU runs after the whole step"
    } else {
        ""
    };
    println!(
        "  scaling efficiency  {:>12.1} %   (one GPU: {:.3} ms{above})",
        s.scaling_efficiency * 100.0,
        s.single_gpu_iteration_time_ms
    );
    println!("  compute             {:>12.3} ms", s.compute_ms);
    println!("  exposed comm        {:>12.3} ms", s.exposed_comm_ms);
    println!("  communication       {:>12.3} ms", s.comm_ms);
    println!("  compression         {:>12.3} ms", s.compression_ms);
    println!(
        "  wire bytes per rank {:>12.1} MB in {} groups, {} collectives",
        s.wire_bytes_per_rank as f64 / 1e6,
        s.groups,
        s.collectives_per_iteration
    );
    print_memory(&s.memory_per_rank);
    if (s.compute_scale - 1.0).abs() > 1e-9 {
        println!(
            "  compute carried to {}: {:.3}x the profile's measured time",
            scenario.device.name, s.compute_scale
        );
        let measured = measured_there(&scenario.model, &scenario.device.name);
        if !measured.is_empty() {
            println!(
                "  profiles measured on {} (--model): {}",
                scenario.device.name,
                measured.join(", ")
            );
        }
    }
    if scenario.collective_slowdown > 1.0 {
        println!(
            "  compute slowed {:.3}x while a collective shares the GPU",
            scenario.collective_slowdown
        );
    }
    for f in &s.codec_cost_fallback {
        println!(
            "  {} on {}: no cost curve in the device profile, memory-bandwidth estimate used",
            f.compressor, f.device
        );
    }
    if let Some(st) = &s.statistics {
        println!(
            "  over {} iterations: mean {:.3} ms, p50 {:.3}, p99 {:.3}, 95% CI [{:.3}, {:.3}]",
            s.measured_iterations,
            st.mean_ms,
            st.p50_ms,
            st.p99_ms,
            st.ci95_low_ms,
            st.ci95_high_ms
        );
    }
}

/// Where `simulate`'s plan comes from.
enum Source {
    /// A plan file (`--plan`).
    Loaded(Box<Plan>),
    /// A strategy that plans on the scenario.
    Strategy(Strategy),
}

/// The shipped profiles of `model`'s tensors and batch measured on `device`, which a user
/// would rather simulate there than the carried profile.
fn measured_there(model: &ModelProfile, device: &str) -> Vec<&'static str> {
    DataKind::Model
        .shipped_names()
        .into_iter()
        .filter(|name| {
            ModelProfile::load(name).is_ok_and(|m| m.device == device && m.same_model(model))
        })
        .collect()
}
