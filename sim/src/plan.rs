//! Plans: fusion groups with their compressor, collective scheme, partitions and priority, plus
//! the launch policy; the one input both the simulator and the runner execute.

use crate::base::data::{self, FORMAT_VERSION};
use crate::base::error::{Result, SimError};
use crate::base::limits;
use crate::compress::{Aggregation, Compressor, Memory, Wire};
use crate::inputs::model::ModelProfile;
use crate::sharding::{Sharding, MAX_PREFETCH};
use serde::{Deserialize, Serialize};

/// How a group's gradients are synchronized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// Whatever the compressor's aggregation rule needs: allreduce for summable payloads,
    /// allgather plus p decodes otherwise.
    Auto,
    /// Flat allreduce over all ranks.
    Allreduce,
    /// Allgather of every rank's payload, each decoded.
    Allgather,
    /// Intra-node reduce-scatter, inter-node allreduce, intra-node allgather.
    Hierarchical,
    /// Push to and pull from parameter servers (the policy says where they run), after
    /// aggregating inside each node (BytePS; HiPress CaSync-PS for compressed payloads).
    Ps,
    /// Reduce-scatter while backward runs, all-gather before the next forward (DeAR).
    ReduceScatterAllgather,
    /// A ring allreduce whose every hop decodes, adds and re-encodes the compressed shard
    /// (HiPress CaSync-Ring), for compressors that cannot be summed as they are.
    CompressedRing,
    /// Reduce-scatter alone: each rank keeps the sum of its shard for the optimizer to update
    /// (a sharded plan's gradients: ZeRO, FSDP).
    ReduceScatter,
    /// Reduce-scatter inside each node, then each shard allreduced across nodes among the ranks
    /// that hold it: each rank keeps the sum of its shard of the node's split (hybrid sharding,
    /// FSDP's HSDP: sharded inside a node, replicated across nodes).
    HybridReduceScatter,
    /// A reduce-scatter for payloads that are not summed as they are: each rank encodes its
    /// gradient chunk by chunk, one chunk per rank, sends each chunk's payload to the rank that
    /// keeps it (an all-to-all), which decodes and adds every rank's payload of its chunk.
    /// ZeRO++'s quantized gradients (qgZ) in their one-hop form (Wang et al. 2023,
    /// arXiv:2306.10209 §3.3, before its hierarchical two-hop version).
    AlltoallReduceScatter,
}

/// Where a group's compression kernels run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressOn {
    /// The GPU the rank computes on.
    #[default]
    Gpu,
    /// The host CPU, with the scenario's host profile (Espresso's CPU compression option).
    Cpu,
}

/// One fusion group: tensors synchronized together as one buffer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    /// Indices into the model's tensors (backward order); the buffer holds them in this order.
    pub tensors: Vec<usize>,
    /// How the group's gradients are compressed.
    pub compressor: Compressor,
    /// What each worker keeps between steps to feed the compression error back.
    pub memory: Memory,
    /// Where the group's compression kernels run.
    pub compress_on: CompressOn,
    /// How the group's gradients are synchronized.
    pub scheme: Scheme,
    /// The buffer is split into this many equal pieces, each its own collective (ByteScheduler).
    pub partitions: u32,
    /// Lower runs first when the launch policy is `priority`.
    pub priority: i64,
}

/// Which stream of a GPU rank runs its codec kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CodecStream {
    /// A stream of their own beside the backward pass, sharing the device with it: fused
    /// codec kernels (`exec`'s, HiPress's).
    #[default]
    Side,
    /// The compute stream, in program order: PyTorch ops called from a gradient hook queue on
    /// the current (default) stream behind the kernels that made the gradient and ahead of
    /// the backward kernels launched after the hook returns, and those called after backward
    /// (decoding in `synchronize`) behind all of it (MergeComp's and DGC's compressors,
    /// Horovod's `Compression`).
    Compute,
}

impl CodecStream {
    /// As plans spell it.
    pub fn name(self) -> &'static str {
        match self {
            CodecStream::Side => "side",
            CodecStream::Compute => "compute",
        }
    }
}

/// How many codec calls compress a group's gradients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CodecCalls {
    /// One call on the group's fused buffer (a piece of it when partitioned): MergeComp's
    /// merged compression, DDP's communication hooks, `exec`'s default.
    #[default]
    Group,
    /// One call per tensor before the fused collective carries their payloads one after
    /// another: Horovod's `Compression` (horovod/torch/optimizer.py compresses each gradient
    /// before `allreduce_async_`), GRACE's communicators (sands-lab/grace
    /// grace_dl/tensorflow/__init__.py, `Communicator.step` per tensor) and MergeComp's
    /// layer-wise baseline (`--fusion-num 0`). Each call pays the codec's floor.
    Tensor,
}

impl CodecCalls {
    /// As plans and flags spell it.
    pub fn name(self) -> &'static str {
        match self {
            CodecCalls::Group => "group",
            CodecCalls::Tensor => "tensor",
        }
    }
}

/// The order in which ready collectives take a communication stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Launch {
    /// Groups launch in plan order, each once it is ready (NCCL needs every rank to issue
    /// collectives in one order; frameworks keep the order they build).
    PlanOrder,
    /// The ready group with the lowest `priority` goes first.
    Priority,
}

/// How the runtime launches the plan's collectives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The order in which ready collectives take a communication stream.
    pub launch: Launch,
    /// Communication streams collectives can run on at once.
    pub comm_streams: u32,
    /// Horovod's background cycle: a ready group launches at the next multiple of this time
    /// (0: immediately).
    pub cycle_time_us: f64,
    /// Each group's optimizer step runs just before its parameters' next forward, so the next
    /// iteration starts without waiting for every group (ByteScheduler, DeAR); otherwise one
    /// optimizer step follows the whole synchronization.
    pub overlap_forward: bool,
    /// Dedicated parameter servers for the `ps` scheme (0: one colocated with each node).
    pub ps_servers: u32,
}

/// What a plan was made for, so that `exec`, `validate` and `lower` need nothing but the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// The model as it was named: a shipped name or an absolute path.
    pub model: String,
    /// The cluster as it was named: a shipped name or an absolute path.
    pub cluster: String,
    /// Nodes of the cluster the plan was made for.
    pub nodes: u32,
    /// GPUs per node of that cluster.
    pub gpus_per_node: u32,
    /// The per-NIC line rate override (`--inter-gbps`), if one was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inter_gbps: Option<f64>,
    /// The host profile that CPU compression was priced with (`--cpu-compression`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_compression: Option<String>,
}

impl Target {
    /// A target from the names a user gave (paths made absolute, so the plan can move) and
    /// the world the cluster resolved to.
    pub fn new(
        model: &str,
        cluster: &str,
        nodes: u32,
        gpus_per_node: u32,
        inter_gbps: Option<f64>,
        cpu_compression: Option<&str>,
    ) -> Target {
        Target {
            model: data::absolute(model),
            cluster: data::absolute(cluster),
            nodes,
            gpus_per_node,
            inter_gbps,
            cpu_compression: cpu_compression.map(data::absolute),
        }
    }
}

/// A complete synchronization plan for one model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Version of the data format the plan is written in.
    pub format_version: u32,
    /// The strategy that produced the plan (informational).
    pub strategy: String,
    /// The model the plan was made for, with its tensor count and a fingerprint of its tensor
    /// names and sizes, so that a plan cannot silently be applied to another model.
    pub model: String,
    /// Tensors in that model.
    pub model_tensors: usize,
    /// [`fingerprint`] of that model's tensor names and sizes.
    pub model_fingerprint: String,
    /// How the runtime launches the plan's collectives.
    pub policy: Policy,
    /// The fusion groups, each synchronized as one buffer.
    pub groups: Vec<Group>,
    /// How the implementation running the plan lays element codes narrower than a byte on the
    /// wire: `packed` (the catalog's formats, what `exec` runs) or `bytes` (one byte per code,
    /// to describe another framework's implementation, such as GRACE's TensorFlow compressors;
    /// the simulator prices it, `exec` refuses it). `lower` turns it into every round's bytes.
    #[serde(default, skip_serializing_if = "is_packed")]
    pub wire: Wire,
    /// Whether each group is compressed by one codec call or by one per tensor (see
    /// [`CodecCalls`]). `lower` turns it into every piece's calls and bytes.
    #[serde(default, skip_serializing_if = "is_group_calls")]
    pub codec_calls: CodecCalls,
    /// Which stream a GPU rank's codec kernels run on (see [`CodecStream`]); CPU ranks run
    /// theirs on their compression thread either way. `lower` places encode and decode on it.
    #[serde(default, skip_serializing_if = "is_side_stream")]
    pub codec_stream: CodecStream,
    /// The framework that runs the plan (`profiles/frameworks/`, a shipped name or an absolute
    /// path), whose per-call costs the simulator adds; absent: the plan's steps alone, as
    /// `exec`'s backends run them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
    /// The codec set whose implementations compress the plan (`profiles/codecs/`, a shipped
    /// name or an absolute path), each op priced by the framework; absent: the device profile's
    /// codec curves, as `exec`'s kernels run them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codecs: Option<String>,
    /// How the plan shards optimizer states, gradients and parameters over the ranks (ZeRO,
    /// FSDP); absent: every rank keeps them whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharding: Option<Sharding>,
    /// The model, cluster and options the plan was made for (plans written by `simulate
    /// --save-plan` and `tune --out` record them; older plans do not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
}

/// FNV-1a over every tensor's name and size: changes whenever the inventory does.
pub fn fingerprint(model: &ModelProfile) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for tensor in &model.tensors {
        for byte in tensor.name.bytes().chain(tensor.numel.to_le_bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

impl Plan {
    /// The groups in the order the forward pass reaches them: by their first tensor to run there.
    pub fn forward_order(&self, model: &ModelProfile) -> Vec<usize> {
        let groups = &self.groups;
        let first = |g: &Group| {
            g.tensors
                .iter()
                .map(|&t| model.tensors[t].registration_index)
                .min()
        };
        let mut order: Vec<usize> = (0..groups.len()).collect();
        order.sort_by_key(|&g| (first(&groups[g]), g));
        order
    }

    /// A plan with the model's identity filled in and default policy.
    pub fn new(strategy: &str, model: &ModelProfile, groups: Vec<Group>, policy: Policy) -> Plan {
        Plan {
            format_version: FORMAT_VERSION,
            strategy: strategy.to_string(),
            model: model.name.clone(),
            model_tensors: model.num_tensors(),
            model_fingerprint: fingerprint(model),
            policy,
            groups,
            wire: Wire::Packed,
            codec_calls: CodecCalls::Group,
            codec_stream: CodecStream::Side,
            framework: None,
            codecs: None,
            sharding: None,
            target: None,
        }
    }

    /// Puts every group on one scheme (`simulate --scheme`, GRACE's allgather runs); `validate`
    /// then rejects compressors that cannot be aggregated that way.
    pub fn set_scheme(&mut self, scheme: Scheme) {
        for group in &mut self.groups {
            group.scheme = scheme;
        }
    }

    /// Reads the plan file at `path` and parses its JSON.
    pub fn load(path: &str) -> Result<Plan> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Io {
            path: path.into(),
            source,
        })?;
        data::parse_json(path, &text)
    }

    /// Checks that the plan fits `model`: same tensors, every tensor in exactly one group,
    /// sensible partitions and policy, and compressors used with an aggregation they allow.
    pub fn validate(&self, label: &str, model: &ModelProfile) -> Result<()> {
        data::check_format_version(label, self.format_version)?;
        if self.model_tensors != model.num_tensors() || self.model_fingerprint != fingerprint(model)
        {
            return Err(SimError::invalid(
                label,
                "model",
                format!(
                    "the plan was made for `{}` ({} tensors, fingerprint {}), not for `{}` ({} tensors, fingerprint {})",
                    self.model,
                    self.model_tensors,
                    self.model_fingerprint,
                    model.name,
                    model.num_tensors(),
                    fingerprint(model)
                ),
            ));
        }
        if self.groups.is_empty() {
            return Err(SimError::invalid(
                label,
                "groups",
                "a plan needs at least one group",
            ));
        }
        if !(1..=limits::MAX_COMM_STREAMS).contains(&self.policy.comm_streams) {
            return Err(SimError::invalid(
                label,
                "policy.comm_streams",
                format!(
                    "{} streams: a plan runs 1 to {} communication streams",
                    self.policy.comm_streams,
                    limits::MAX_COMM_STREAMS
                ),
            ));
        }
        limits::check_duration_us(label, "policy.cycle_time_us", self.policy.cycle_time_us)?;
        if u64::from(self.policy.ps_servers) > limits::MAX_RANKS {
            return Err(SimError::invalid(
                label,
                "policy.ps_servers",
                format!("at most {} servers", limits::MAX_RANKS),
            ));
        }
        let pieces: u64 = self.groups.iter().map(|g| u64::from(g.partitions)).sum();
        if pieces > limits::MAX_PIECES {
            return Err(SimError::invalid(
                label,
                "groups[].partitions",
                format!(
                    "{pieces} partitions in all, each a collective per iteration; at most {} are supported",
                    limits::MAX_PIECES
                ),
            ));
        }
        let mut owner: Vec<Option<usize>> = vec![None; model.num_tensors()];
        for (g, group) in self.groups.iter().enumerate() {
            let at = |field: &str| format!("groups[{g}].{field}");
            if group.tensors.is_empty() {
                return Err(SimError::invalid(
                    label,
                    at("tensors"),
                    "a group needs at least one tensor",
                ));
            }
            if group.partitions == 0 {
                return Err(SimError::invalid(
                    label,
                    at("partitions"),
                    "needs at least one partition",
                ));
            }
            for &t in &group.tensors {
                match owner.get_mut(t) {
                    None => {
                        return Err(SimError::invalid(
                            label,
                            at("tensors"),
                            format!(
                                "tensor index {t} is out of range: the model has {} tensors",
                                model.num_tensors()
                            ),
                        ))
                    }
                    Some(Some(other)) => {
                        return Err(SimError::invalid(
                            label,
                            at("tensors"),
                            format!(
                                "tensor {t} ({}) is also in groups[{other}]",
                                model.tensors[t].name
                            ),
                        ))
                    }
                    Some(slot) => *slot = Some(g),
                }
            }
            if matches!(
                group.scheme,
                Scheme::ReduceScatterAllgather | Scheme::ReduceScatter
            ) && group.compressor.allreduce_rounds() > 1
            {
                return Err(SimError::invalid(
                    label,
                    at("scheme"),
                    format!(
                        "`{}` reduces in two dependent rounds, which the {} scheme cannot split",
                        group.compressor,
                        group.scheme.name()
                    ),
                ));
            }
            // What a scheme needs of each codec call.
            let c = group.compressor;
            let refused = match group.scheme {
                Scheme::CompressedRing => c
                    .why_no_ring_hops()
                    .map(|why| format!("a compressed ring cannot run `{c}`: {why}")),
                Scheme::AlltoallReduceScatter => c.why_one_call().map(|why| {
                    format!("an all-to-all reduce-scatter encodes each rank's chunk in a call of its own, which `{c}` cannot: {why}")
                }),
                _ => None,
            };
            if let Some(message) = refused {
                return Err(SimError::invalid(label, at("scheme"), message));
            }
            if self.codec_calls == CodecCalls::Tensor {
                check_calls_per_tensor(label, g, group)?;
            }
            let aggregation = group.aggregation();
            let allowed = group.compressor.allowed_aggregations();
            if !allowed.contains(&aggregation) {
                let names: Vec<&str> = allowed.iter().map(|a| a.name()).collect();
                return Err(SimError::invalid(
                    label,
                    at("scheme"),
                    format!(
                        "compressor `{}` cannot be aggregated by the {} scheme ({}); it allows {}",
                        group.compressor,
                        group.scheme.name(),
                        aggregation.name(),
                        names.join(" or ")
                    ),
                ));
            }
        }
        check_sharding(self.sharding.as_ref(), label, &self.groups)?;
        if let Some(sharding) = &self.sharding {
            check_float8_all_gather(sharding, label, model)?;
        }
        if let Some(missing) = owner.iter().position(Option::is_none) {
            let count = owner.iter().filter(|o| o.is_none()).count();
            return Err(SimError::invalid(
                label,
                "groups",
                format!(
                    "{count} tensor(s) are in no group, the first being {missing} ({})",
                    model.tensors[missing].name
                ),
            ));
        }
        Ok(())
    }
}

/// A group compressed tensor by tensor needs a codec that works element by element into
/// payloads of known length, laid one after another: PowerSGD already compresses each matrix
/// of its group on its own (in two rounds), `threshold`'s length depends on the data, and a
/// CaSync-Ring hop re-encodes shards that cut across tensors.
fn check_calls_per_tensor(label: &str, g: usize, group: &Group) -> Result<()> {
    let why = group
        .compressor
        .why_one_call()
        .or_else(|| match group.scheme {
            Scheme::CompressedRing => {
                Some("a compressed ring re-encodes shards that cut across tensors".to_string())
            }
            Scheme::AlltoallReduceScatter => {
                Some("an all-to-all reduce-scatter encodes one call per rank's chunk".to_string())
            }
            _ => None,
        });
    match why {
        Some(why) => Err(SimError::invalid(
            label,
            "codec_calls",
            format!("`tensor` cannot compress groups[{g}]: {why}; use `group`"),
        )),
        None => Ok(()),
    }
}

impl Scheme {
    /// The scheme that reduce-scatters a unit of `sharding` compressed by `compressor`: over
    /// every rank (by an all-to-all when its payloads do not sum as they are), or inside each
    /// node then across nodes (`within_node`).
    pub fn scattering(sharding: &Sharding, compressor: Compressor) -> Scheme {
        match (sharding.within_node, compressor.summed_as()) {
            (true, _) => Scheme::HybridReduceScatter,
            (false, Some(_)) => Scheme::ReduceScatter,
            (false, None) => Scheme::AlltoallReduceScatter,
        }
    }

    /// Whether each rank keeps only its shard of the sum (a sharded plan's reduction).
    pub fn scatters(self) -> bool {
        matches!(
            self,
            Scheme::ReduceScatter | Scheme::HybridReduceScatter | Scheme::AlltoallReduceScatter
        )
    }

    /// The scheme as plan files spell it.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Auto => "auto",
            Scheme::Allreduce => "allreduce",
            Scheme::Allgather => "allgather",
            Scheme::Hierarchical => "hierarchical",
            Scheme::Ps => "ps",
            Scheme::ReduceScatterAllgather => "reduce-scatter-allgather",
            Scheme::CompressedRing => "compressed-ring",
            Scheme::ReduceScatter => "reduce-scatter",
            Scheme::HybridReduceScatter => "hybrid-reduce-scatter",
            Scheme::AlltoallReduceScatter => "alltoall-reduce-scatter",
        }
    }
}

impl Group {
    /// The aggregation the group's scheme implies.
    pub fn aggregation(&self) -> Aggregation {
        match self.scheme {
            Scheme::Auto => self.compressor.aggregation(),
            Scheme::Allreduce
            | Scheme::Hierarchical
            | Scheme::ReduceScatterAllgather
            | Scheme::ReduceScatter
            | Scheme::HybridReduceScatter => Aggregation::Allreduce,
            // Every rank's payload of a chunk is decoded where the chunk is kept.
            Scheme::Allgather | Scheme::AlltoallReduceScatter => Aggregation::Allgather,
            // Every hop decodes and re-encodes, as a server would.
            Scheme::Ps | Scheme::CompressedRing => Aggregation::ParameterServer,
        }
    }

    /// Elements of the group's tensors together.
    pub fn numel(&self, model: &ModelProfile) -> u64 {
        self.tensors.iter().map(|&t| model.tensors[t].numel).sum()
    }

    /// Bytes one rank contributes to the group's synchronization (all rounds and partitions)
    /// when its codes are laid out as `wire` says (the plan's [`Plan::wire`]).
    pub fn wire_bytes(&self, model: &ModelProfile, wire: Wire) -> u64 {
        match self.compressor {
            // Only PowerSGD's size depends on the tensors' shapes.
            Compressor::PowerSgd { .. } => {
                let shapes: Vec<&[u64]> = self
                    .tensors
                    .iter()
                    .map(|&t| model.tensors[t].shape.as_slice())
                    .collect();
                self.compressor.group_wire_bytes(&shapes)
            }
            _ => self.compressor.wire_bytes_as(self.numel(model), wire),
        }
    }
}

fn is_packed(wire: &Wire) -> bool {
    *wire == Wire::Packed
}

fn is_group_calls(calls: &CodecCalls) -> bool {
    *calls == CodecCalls::Group
}

fn is_side_stream(stream: &CodecStream) -> bool {
    *stream == CodecStream::Side
}

/// Checks the sharding against the plan's groups: every group reduce-scattered (and only
/// in a sharded plan) or allreduced, the prefetch bounded, the resident units real. `label`
/// names the plan.
fn check_sharding(sharding: Option<&Sharding>, label: &str, groups: &[Group]) -> Result<()> {
    let scattered = |g: &Group| g.scheme.scatters();
    let Some(sharding) = sharding else {
        return match groups.iter().position(scattered) {
            Some(g) => Err(SimError::invalid(
                label,
                format!("groups[{g}].scheme"),
                "`reduce-scatter` keeps only a shard of the sum on each rank: it needs the plan's `sharding`",
            )),
            None => Ok(()),
        };
    };
    // A unit is reduce-scattered (FSDP), or allreduced whole with each rank keeping its
    // shard (DeepSpeed's ZeRO-1 and 2, `allreduce_and_scatter`).
    let scatters = match sharding.within_node {
        true => &[Scheme::HybridReduceScatter][..],
        false => &[Scheme::ReduceScatter, Scheme::AlltoallReduceScatter][..],
    };
    let reduces = |g: &Group| {
        scatters.contains(&g.scheme) || matches!(g.scheme, Scheme::Auto | Scheme::Allreduce)
    };
    if let Some(g) = groups.iter().position(|g| !reduces(g)) {
        let names: Vec<String> = scatters.iter().map(|s| format!("`{}`", s.name())).collect();
        return Err(SimError::invalid(
            label,
            format!("groups[{g}].scheme"),
            format!(
                "a plan sharded {} reduce-scatters or allreduces each unit's gradients ({}, `auto`, `allreduce`), not `{}`",
                if sharding.within_node { "inside each node (`within_node`)" } else { "over every rank" },
                names.join(", "),
                groups[g].scheme.name()
            ),
        ));
    }
    if let Some(g) = groups.iter().position(|g| g.partitions != 1) {
        return Err(SimError::invalid(
            label,
            format!("groups[{g}].partitions"),
            "a sharded plan's unit is one piece: its shards are the partition",
        ));
    }
    if sharding.prefetch > MAX_PREFETCH {
        return Err(SimError::invalid(
            label,
            "sharding.prefetch",
            format!("is 0 to {MAX_PREFETCH}, got {}", sharding.prefetch),
        ));
    }
    if let Some(&g) = sharding.resident.iter().find(|&&g| g >= groups.len()) {
        return Err(SimError::invalid(
            label,
            "sharding.resident",
            format!("group {g} does not exist: the plan has {}", groups.len()),
        ));
    }
    if !sharding.stage.shards_parameters()
        && (!sharding.resident.is_empty() || sharding.reshard_after_forward)
    {
        return Err(SimError::invalid(
            label,
            "sharding.reshard_after_forward",
            format!(
                "only stage zero3 frees parameters after forward; {} keeps them whole",
                sharding.stage.name()
            ),
        ));
    }
    let regathers_over_every_rank = sharding.stage.shards_parameters()
        && sharding.reshard_after_forward
        && !sharding.within_node;
    if sharding.secondary_within_node && !regathers_over_every_rank {
        return Err(SimError::invalid(
            label,
            "sharding.secondary_within_node",
            "ZeRO++'s secondary shard (hpZ) serves the gathers before backward of a plan sharded over every rank (stage zero3, reshard_after_forward, not within_node)",
        ));
    }
    if sharding.param_dtype.quantizer().is_some() && !sharding.stage.shards_parameters() {
        return Err(SimError::invalid(
            label,
            "sharding.param_dtype",
            format!(
                "`{}` quantizes ZeRO-3's gathers (ZeRO++'s quantized weights); {} gathers the updated parameters once, as stored",
                sharding.param_dtype.name(),
                sharding.stage.name()
            ),
        ));
    }
    Ok(())
}

/// torchao's float8 all-gather is FSDP2's (stage 3, HSDP included, no hpZ) and casts from the
/// stored weights (fp32 or bf16 for the rest), and needs a weight it converts.
fn check_float8_all_gather(sharding: &Sharding, label: &str, model: &ModelProfile) -> Result<()> {
    if !sharding.float8_all_gather {
        return Ok(());
    }
    let refused = |why: String| Err(SimError::invalid(label, "sharding.float8_all_gather", why));
    if !sharding.stage.shards_parameters() {
        return refused(format!(
            "torchao's float8 all-gather casts FSDP2's gathers of parameters (stage zero3); {} gathers the updated parameters once, as stored",
            sharding.stage.name()
        ));
    }
    if sharding.secondary_within_node {
        return refused(
            "ZeRO++'s secondary shards (hpZ) are DeepSpeed's, torchao's float8 all-gather FSDP2's: no framework runs both".into(),
        );
    }
    if sharding.param_dtype.quantizer().is_some() {
        return refused(format!(
            "the weights are cast to float8 from FSDP2's stored parameters; `param_dtype` {} is ZeRO++'s",
            sharding.param_dtype.name()
        ));
    }
    if !model.tensors.iter().any(|t| t.is_float8_linear_weight()) {
        let mut classes: Vec<&str> = model
            .tensors
            .iter()
            .filter_map(|t| t.module.as_deref())
            .collect();
        classes.sort_unstable();
        classes.dedup();
        return refused(match classes.is_empty() {
            false => format!(
                "model {} has no nn.Linear weight whose dimensions are multiples of 16, which is what torchao converts to float8 (its tensors' modules: {})",
                model.name,
                classes.join(", ")
            ),
            true => format!(
                "model {}'s profile does not record which module owns each tensor (tensors[].module), so which weights torchao converts to float8 is unknown",
                model.name
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::per_tensor_plan;

    #[test]
    fn compressing_each_tensor_refuses_codecs_that_cannot_by_field() {
        let model = ModelProfile::load("resnet50").unwrap();
        let mut plan = per_tensor_plan(&model);
        plan.codec_calls = CodecCalls::Tensor;
        plan.groups[3].compressor = Compressor::TopK { ratio: 0.01 };
        plan.validate("p", &model).unwrap();
        let refused = |plan: &Plan, why: &str| {
            let err = plan.validate("p", &model).unwrap_err().to_string();
            assert!(
                err.contains("codec_calls") && err.contains("groups[3]"),
                "{err}"
            );
            assert!(err.contains(why), "{err}");
        };
        let mut rounds = plan.clone();
        rounds.groups[3].compressor = Compressor::PowerSgd { rank: 2 };
        refused(&rounds, "each matrix");
        let mut ring = plan.clone();
        ring.groups[3].scheme = Scheme::CompressedRing;
        refused(&ring, "shards");
        let mut threshold = plan.clone();
        threshold.groups[3].compressor = "threshold:0.01".parse().unwrap();
        refused(&threshold, "data-dependent");
    }

    #[test]
    fn a_compressed_ring_refuses_codecs_its_hops_cannot_reencode() {
        let model = ModelProfile::load("resnet50").unwrap();
        let mut plan = per_tensor_plan(&model);
        plan.groups[3].scheme = Scheme::CompressedRing;
        for (compressor, ok) in [
            ("onebit", true),
            ("dgc:0.01", true),
            ("randomk:0.01", false),
            ("signum:0.9", false),
        ] {
            plan.groups[3].compressor = compressor.parse().unwrap();
            let result = plan.validate("p", &model);
            assert_eq!(result.is_ok(), ok, "{compressor}: {result:?}");
            if let Err(err) = result {
                let err = err.to_string();
                assert!(
                    err.contains("groups[3].scheme") && err.contains("compressed ring"),
                    "{err}"
                );
            }
        }
    }
}
