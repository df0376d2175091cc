//! Codec implementations written as framework ops: their ops and bytes per call.
//!
//! The implementations are MergeComp's PyTorch compressors, Horovod's fp16 and GRACE's TensorFlow
//! ones; their ops and bytes are priced by the framework and the device.
//!
//! A compressor's cost on a device depends on how it is written. A fused CUDA kernel pays one
//! launch; the same compressor written as a dozen PyTorch ops pays a dozen host dispatches, and
//! compressing tensor by tensor pays them once per tensor. That is what tensor merging trades
//! against (MergeComp's layer-wise compression is slower than its merged groups for exactly this
//! reason). A codec set (`profiles/codecs/*.json`) declares, for each compressor a system ships,
//! the ops each phase launches and the bytes they move, read from the system's public source and
//! cited; the framework running the plan prices an op (`op_us`), the device a byte. A set of
//! fused CUDA kernels that a system launches itself (HiPress's CompLL) prices an op as one kernel
//! launch (`op_cost: kernel_launch`), whatever framework runs the plan.

use super::fallback;
use crate::base::data::{self, DataKind};
use crate::base::error::{Result, SimError};
use crate::compress::{why_no_kept_cost, Compressor, Memory};
use crate::inputs::device::{
    CodecCost, CostCurve, DeviceKind, DeviceProfile, FreshMemory, FreshPages,
};
use crate::inputs::framework::Framework;
use crate::inputs::model::{Provenance, Status};
use crate::plan::{CodecStream, Plan};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Most ops one phase of a codec may declare, and most bytes per element: far above any real
/// codec, low enough that a time computed from them stays finite and within the duration limit.
const MAX_OPS: u32 = 10_000;
const MAX_BYTES_PER_ELEMENT: f64 = 10_000.0;
/// Most ns per element of one block's serial work (about a thousand times the slowest measured).
const MAX_SERIAL_NS_PER_ELEMENT: f64 = 10_000.0;

/// Work of one phase of a codec: the framework ops it launches and the bytes they read and
/// write per element of the fp32 tensor.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpWork {
    /// Framework ops the phase launches.
    pub ops: u32,
    /// Bytes the ops read and write per element of the fp32 tensor.
    pub bytes_per_element: f64,
    /// A sparsifier's bytes per element it keeps (gathering, sending out and scattering the kept
    /// values), which grow with its ratio.
    #[serde(default)]
    pub bytes_per_kept_element: f64,
    /// Time per element of work that one thread block does alone, whatever the device's size,
    /// in ns: measured, not priced by bytes (PyTorch 1.x's `torch.topk` of a flat tensor runs
    /// its radix select in one block per slice).
    #[serde(default)]
    pub serial_ns_per_element: f64,
    /// Bytes per element of the one tensor the phase allocates and writes (`torch.clone`, an
    /// operator's new result): its size is this times the call's elements, and where that
    /// reaches the device's `fresh_memory.from_bytes` each of its bytes costs
    /// `fresh_memory.ns_per_byte` on top of its price as a byte moved (counted in
    /// `bytes_per_element`).
    #[serde(default)]
    pub fresh_bytes_per_element: f64,
}

impl OpWork {
    /// Ops, bytes and one block's time are bounded and not negative, and only a sparsifier (`key`) has bytes per
    /// kept element; `field` names this phase in errors.
    pub fn check(&self, label: &str, field: &str, key: &str) -> Result<()> {
        if self.ops > MAX_OPS {
            return Err(SimError::invalid(
                label,
                format!("{field}.ops"),
                format!("is 0 to {MAX_OPS}, got {}", self.ops),
            ));
        }
        for (name, value, most) in [
            (
                "bytes_per_element",
                self.bytes_per_element,
                MAX_BYTES_PER_ELEMENT,
            ),
            (
                "bytes_per_kept_element",
                self.bytes_per_kept_element,
                MAX_BYTES_PER_ELEMENT,
            ),
            (
                "serial_ns_per_element",
                self.serial_ns_per_element,
                MAX_SERIAL_NS_PER_ELEMENT,
            ),
            (
                "fresh_bytes_per_element",
                self.fresh_bytes_per_element,
                MAX_BYTES_PER_ELEMENT,
            ),
        ] {
            data::check_non_negative(label, &format!("{field}.{name}"), value)?;
            if value > most {
                return Err(SimError::invalid(
                    label,
                    format!("{field}.{name}"),
                    format!("is at most {most}, got {value}"),
                ));
            }
        }
        if self.fresh_bytes_per_element > self.bytes_per_element {
            return Err(SimError::invalid(
                label,
                format!("{field}.fresh_bytes_per_element"),
                format!(
                    "counts bytes of bytes_per_element ({}), so is at most that, got {}",
                    self.bytes_per_element, self.fresh_bytes_per_element
                ),
            ));
        }
        // Asked only of a kept cost, as device profiles ask it.
        let why = (self.bytes_per_kept_element > 0.0)
            .then(|| why_no_kept_cost(key))
            .flatten();
        match why {
            Some(why) => Err(SimError::invalid(
                label,
                format!("{field}.bytes_per_kept_element"),
                why,
            )),
            None => Ok(()),
        }
    }

    /// Its ops and bytes, as provenance words them.
    pub fn describe(&self) -> String {
        let kept = match self.bytes_per_kept_element {
            0.0 => String::new(),
            kept => format!(" and {kept} B per kept element"),
        };
        let serial = match self.serial_ns_per_element {
            0.0 => String::new(),
            ns => format!(", {ns} ns per element in one block"),
        };
        let fresh = match self.fresh_bytes_per_element {
            0.0 => String::new(),
            bytes => format!(", {bytes} B written into fresh memory"),
        };
        format!(
            "{} ops and {} B per element{kept}{fresh}{serial}",
            self.ops, self.bytes_per_element
        )
    }

    /// The cost curve of this work at `us_per_op` and `ns_per_byte`, its new tensor's bytes
    /// costing what `fresh` says where it is large enough to be mapped anew.
    pub fn curve(
        &self,
        us_per_op: f64,
        ns_per_byte: f64,
        fresh: Option<&FreshMemory>,
    ) -> CostCurve {
        let bytes = self.fresh_bytes_per_element;
        let fresh_pages = fresh.filter(|_| bytes > 0.0).map(|fresh| FreshPages {
            // Checked: `bytes` is positive and at most MAX_BYTES_PER_ELEMENT.
            from_elements: (fresh.from_bytes as f64 / bytes).ceil() as u64,
            ns_per_element: bytes * fresh.ns_per_byte,
        });
        CostCurve {
            floor_us: f64::from(self.ops) * us_per_op,
            ns_per_element: self.bytes_per_element * ns_per_byte + self.serial_ns_per_element,
            ns_per_kept_element: self.bytes_per_kept_element * ns_per_byte,
            fresh_pages,
        }
    }
}

/// One compressor as an implementation writes it: the encode (with its error-feedback memory),
/// each payload a rank decodes (an allgather's p, an allreduce's one), and once per decode call
/// (summing the decoded payloads, averaging).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Implementation {
    /// The encode, with its error-feedback memory.
    pub encode: OpWork,
    /// The work of decoding each payload a rank receives.
    pub payload: OpWork,
    /// The work once per decode call (summing the decoded payloads, averaging).
    pub call: OpWork,
    /// The error-feedback memory (`--memory`, its kind) the source runs the codec with, when
    /// the phases count everything the source does around the codec with it: the gradient's
    /// copies, the memory's compensation and its update. A plan compressing with another kind
    /// is refused, and the plan's memory passes are not priced again. Absent: the phases count
    /// the codec alone, and the plan's memory is priced by its own passes, whatever it is.
    #[serde(default)]
    pub memory: Option<Memory>,
    /// The source files and ops counted.
    pub source: String,
}

impl Implementation {
    /// Every phase checked for compressor `key`; `field` names the implementation in errors.
    pub fn check(&self, label: &str, field: &str, key: &str) -> Result<()> {
        for (phase, work) in [
            ("encode", self.encode),
            ("payload", self.payload),
            ("call", self.call),
        ] {
            work.check(label, &format!("{field}.{phase}"), key)?;
        }
        Ok(())
    }

    /// Why a plan compressing with `memory` is not what this implementation was counted with,
    /// if it is not.
    fn why_not_with(&self, memory: &Memory) -> Option<String> {
        let written = self.memory?.name();
        let how = match written {
            "none" => "without error feedback".to_string(),
            _ => format!("with error-feedback memory `{written}`"),
        };
        (written != memory.name()).then(|| {
            format!(
                "is written {how} and the plan's memory is `{memory}` (`--memory {written}`, \
                 or `--codecs native` for the device's own curves)"
            )
        })
    }

    /// This implementation as it runs on `device`: one thread block's serial work is a GPU's;
    /// a CPU rank runs the framework's CPU kernel of the same op, priced by its bytes.
    fn on(&self, device: &DeviceProfile) -> Implementation {
        let mut on = self.clone();
        if device.kind != DeviceKind::Gpu {
            for work in [&mut on.encode, &mut on.payload, &mut on.call] {
                work.serial_ns_per_element = 0.0;
            }
        }
        on
    }

    /// Its cost at `us_per_op` and `ns_per_byte`, new tensors at `fresh`, with `provenance`.
    fn cost(
        &self,
        us_per_op: f64,
        ns_per_byte: f64,
        fresh: Option<&FreshMemory>,
        provenance: Provenance,
    ) -> CodecCost {
        CodecCost {
            encode: self.encode.curve(us_per_op, ns_per_byte, fresh),
            decode: self.payload.curve(us_per_op, ns_per_byte, fresh),
            aggregate: self.call.curve(us_per_op, ns_per_byte, fresh),
            includes_passes: self.memory.is_some(),
            provenance,
        }
    }

    /// Whether any phase writes fresh memory.
    pub fn allocates(&self) -> bool {
        [self.encode, self.payload, self.call]
            .iter()
            .any(|work| work.fresh_bytes_per_element > 0.0)
    }
}

/// What one op of a codec set costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpCost {
    /// A framework op (a PyTorch or TensorFlow op dispatched from Python): the framework running
    /// the plan prices it (`op_us`).
    #[default]
    Framework,
    /// A kernel the system launches itself: one launch, as the catalog's estimates price it.
    KernelLaunch,
}

/// The name that asks for the device profile's codec curves: the plan's codecs as `exec` runs
/// them.
pub const NATIVE: &str = "native";

/// The compressors one system ships, as `profiles/codecs/*.json` stores them.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodecSet {
    /// The file's format version (`crate::base::data::FORMAT_VERSION`).
    pub format_version: u32,
    /// The set's name, quoted in the priced curves' provenance.
    pub name: String,
    /// The system whose compressors the set holds, in words.
    pub description: String,
    /// Which stream of a GPU rank its ops run on; absent: a stream of their own (fused
    /// kernels). PyTorch ops called from a hook run on the compute stream.
    #[serde(default)]
    pub stream: CodecStream,
    /// What one of its ops costs: a framework op (the default) or a kernel launch.
    #[serde(default)]
    pub op_cost: OpCost,
    /// Each compressor by its catalog key (`fp16`, `dgc`, `topk`, ...).
    pub codecs: BTreeMap<String, Implementation>,
    /// Whether the ops and bytes were measured or estimated, and how.
    pub provenance: Provenance,
}

impl CodecSet {
    /// Loads a shipped codec set by name or a codec-set file by path.
    pub fn load(name_or_path: &str) -> Result<CodecSet> {
        data::load(DataKind::Codecs, name_or_path, CodecSet::validate)
    }

    /// The codec set a flag or plan names: `native` is none; a name or path loads. The plan
    /// records the returned name (a path made absolute).
    pub fn named(name_or_path: &str) -> Result<Option<(String, CodecSet)>> {
        if name_or_path == NATIVE {
            return Ok(None);
        }
        let set = CodecSet::load(name_or_path)?;
        Ok(Some((data::absolute(name_or_path), set)))
    }

    /// Known compressor keys, each implementation's work sound for its compressor.
    pub fn validate(&self, label: &str) -> Result<()> {
        data::check_format_version(label, self.format_version)?;
        if self.codecs.is_empty() {
            return Err(SimError::invalid(
                label,
                "codecs",
                "needs at least one codec",
            ));
        }
        for (key, implementation) in &self.codecs {
            let known = crate::compress::catalog()
                .iter()
                .any(|entry| entry.key == key.as_str());
            if !known {
                return Err(SimError::invalid(
                    label,
                    format!("codecs.{key}"),
                    "is not a compressor of the catalog (see `syncopate list compressors`)",
                ));
            }
            implementation.check(label, &format!("codecs.{key}"), key)?;
        }
        Ok(())
    }

    /// Every compressor of `plan` implemented here with its memory, and the plan's codecs on
    /// this set's stream.
    pub fn check_plan(&self, plan: &Plan) -> Result<()> {
        self.check_compressors(plan.groups.iter().map(|g| (&g.compressor, &g.memory)))?;
        self.check_stream(plan)
    }

    /// The plan's codecs on this set's stream: its ops are priced where they run.
    pub fn check_stream(&self, plan: &Plan) -> Result<()> {
        if plan.codec_stream != self.stream {
            return Err(SimError::invalid(
                "plan",
                "codec_stream",
                format!(
                    "is `{}`, but codec set `{}` runs its ops on the `{}` stream",
                    plan.codec_stream.name(),
                    self.name,
                    self.stream.name()
                ),
            ));
        }
        Ok(())
    }

    /// Every compressor but `none` implemented here with its error-feedback memory, or an
    /// error naming the first that is not.
    pub fn check_compressors<'a>(
        &self,
        compressors: impl IntoIterator<Item = (&'a Compressor, &'a Memory)>,
    ) -> Result<()> {
        for (c, memory) in compressors {
            if let Some(why) = self.why_not_written(c, memory) {
                return Err(SimError::invalid(&self.name, "codecs", why));
            }
        }
        Ok(())
    }

    /// The memory this set writes `c` with, where it names one.
    pub fn memory_of(&self, c: &Compressor) -> Option<Memory> {
        self.codecs.get(c.key())?.memory
    }

    /// Whether this set prices `c` compressing with `memory` (`none` needs no codec).
    pub fn writes(&self, c: &Compressor, memory: &Memory) -> bool {
        self.why_not_written(c, memory).is_none()
    }

    fn why_not_written(&self, c: &Compressor, memory: &Memory) -> Option<String> {
        if *c == Compressor::None {
            return None;
        }
        match self.codecs.get(c.key()) {
            Some(implementation) => implementation
                .why_not_with(memory)
                .map(|why| format!("`{}` {why}", c.key())),
            None => Some(format!(
                "has no `{}` (it has {})",
                c.key(),
                self.codecs.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// `device` with every compressor of this set priced as written: each op at the set's own
    /// kernel launch or else at `framework`'s `op_us`, each byte at the device's memory
    /// bandwidth with the efficiency the catalog's estimates use. `None` when the ops are the
    /// framework's and no framework runs the plan.
    pub fn priced_on(
        &self,
        device: &DeviceProfile,
        framework: Option<&Framework>,
    ) -> Option<DeviceProfile> {
        let (us_per_op, op_price) = match (self.op_cost, framework) {
            (OpCost::KernelLaunch, _) => {
                let launch_us = fallback::launch_us(device);
                (launch_us, format!("one kernel launch, {launch_us} us"))
            }
            (OpCost::Framework, Some(framework)) => (
                framework.op_us,
                format!(
                    "framework `{}`'s op_us {} us",
                    framework.name, framework.op_us
                ),
            ),
            (OpCost::Framework, None) => return None,
        };
        let mut priced = device.clone();
        let ns_per_byte = fallback::ns_per_byte(device);
        let fresh = device.fresh_memory.as_ref();
        let fresh_price = match fresh {
            Some(fresh) => format!(
                "; a byte of a new tensor of at least {} B {:.5} ns more ({})",
                fresh.from_bytes, fresh.ns_per_byte, fresh.provenance.method
            ),
            None => format!(
                "; new tensors as memory in use (device `{}` has no fresh_memory)",
                device.name
            ),
        };
        for (key, implementation) in &self.codecs {
            let implementation = implementation.on(device);
            let fresh_price = match implementation.allocates() {
                true => fresh_price.as_str(),
                false => "",
            };
            let provenance = Provenance {
                status: Status::Estimated,
                method: format!(
                    "{} codec `{key}` as written ({}): encode {}, each payload {}, each call {}; \
                     an op at {op_price}, a byte at {ns_per_byte:.5} ns ({}){fresh_price}",
                    self.name,
                    implementation.source,
                    implementation.encode.describe(),
                    implementation.payload.describe(),
                    implementation.call.describe(),
                    fallback::BYTE_PRICE_SOURCE,
                ),
            };
            priced.compression.insert(
                key.clone(),
                implementation.cost(us_per_op, ns_per_byte, fresh, provenance),
            );
        }
        Some(priced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(codecs: &str) -> Result<CodecSet> {
        let text = format!(
            r#"{{"format_version": 1, "name": "s", "description": "d",
                "codecs": {codecs},
                "provenance": {{"status": "estimated", "method": "test"}}}}"#
        );
        let set: CodecSet = data::parse_json("s.json", &text)?;
        set.validate("s.json")?;
        Ok(set)
    }

    const FP16: &str = r#"{"fp16": {"encode": {"ops": 1, "bytes_per_element": 6},
        "payload": {"ops": 1, "bytes_per_element": 6},
        "call": {"ops": 0, "bytes_per_element": 0}, "source": "t"}}"#;

    #[test]
    fn every_shipped_codec_set_loads() {
        for name in DataKind::Codecs.shipped_names() {
            let set = CodecSet::load(name).unwrap();
            assert_eq!(set.name, name);
        }
    }

    #[test]
    fn unknown_compressors_and_bad_work_name_their_field() {
        let err = set(&FP16.replace("\"fp16\"", "\"fp17\""))
            .unwrap_err()
            .to_string();
        assert!(err.contains("codecs.fp17"), "{err}");
        for (bad, field) in [
            (
                "\"bytes_per_element\": -6",
                "codecs.fp16.encode.bytes_per_element",
            ),
            (
                "\"bytes_per_element\": 1e9",
                "codecs.fp16.encode.bytes_per_element",
            ),
            (
                "\"bytes_per_element\": 6, \"bytes_per_kept_element\": 4",
                "codecs.fp16.encode.bytes_per_kept_element",
            ),
            (
                "\"bytes_per_element\": 6, \"serial_ns_per_element\": -1",
                "codecs.fp16.encode.serial_ns_per_element",
            ),
            (
                "\"bytes_per_element\": 6, \"serial_ns_per_element\": 1e9",
                "codecs.fp16.encode.serial_ns_per_element",
            ),
        ] {
            let text = FP16.replacen("\"bytes_per_element\": 6", bad, 1);
            let err = set(&text).unwrap_err().to_string();
            assert!(err.contains(field), "{bad}: {err}");
        }
        let err = set(&FP16.replacen("\"ops\": 1", "\"ops\": 20000", 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("codecs.fp16.encode.ops"), "{err}");
    }

    #[test]
    fn kernels_a_system_launches_cost_a_launch_each_whatever_the_framework() {
        let device = DeviceProfile::load("v100-sxm2-32gb").unwrap();
        // Framework ops need the framework that runs the plan to price them.
        assert!(set(FP16).unwrap().priced_on(&device, None).is_none());
        let kernels = set(FP16)
            .map(|mut set| {
                set.op_cost = OpCost::KernelLaunch;
                set
            })
            .unwrap();
        let framework = Framework::load("horovod").unwrap();
        for framework in [None, Some(&framework)] {
            let priced = kernels.priced_on(&device, framework).unwrap();
            let encode = priced.codec_cost("fp16").unwrap().encode;
            assert_eq!(encode.floor_us, fallback::GPU_LAUNCH_US);
            assert!((encode.ns_per_element - 6.0 / 630.0).abs() < 1e-12);
        }
        // A CPU's codecs are function calls: no launch.
        let host = DeviceProfile::load("host-2core").unwrap();
        let priced = kernels.priced_on(&host, None).unwrap();
        assert_eq!(priced.codec_cost("fp16").unwrap().encode.floor_us, 0.0);
    }

    #[test]
    fn bytes_written_into_fresh_memory_cost_what_the_device_measured_for_them() {
        let fresh = FP16.replacen(
            "\"bytes_per_element\": 6",
            "\"bytes_per_element\": 6, \"fresh_bytes_per_element\": 2",
            1,
        );
        let set = set(&fresh).unwrap();
        let framework = Framework::load("pytorch-ddp").unwrap();
        let mut host = DeviceProfile::load("host-2core").unwrap();
        host.fresh_memory = None;
        let in_use = set.priced_on(&host, Some(&framework)).unwrap();
        let cost = in_use.codec_cost("fp16").unwrap();
        assert!(cost.provenance.method.contains("has no fresh_memory"));
        host.fresh_memory = Some(FreshMemory {
            ns_per_byte: 0.4,
            from_bytes: 8_000,
            provenance: Provenance {
                status: Status::Measured,
                method: "probe".into(),
            },
        });
        let priced = set.priced_on(&host, Some(&framework)).unwrap();
        let fresh = priced.codec_cost("fp16").unwrap();
        // A new tensor of 2 B per element reaches 8,000 B at 4,000 elements; from there each
        // element pays 2 bytes at 0.4 ns on top of the same work in memory in use.
        let more = |n: u64| fresh.encode.time(n, 0).as_ns() - cost.encode.time(n, 0).as_ns();
        assert_eq!(more(3_999), 0);
        assert_eq!(more(4_000), 3_200);
        assert_eq!(fresh.decode, cost.decode);
        assert!(fresh
            .provenance
            .method
            .contains("a byte of a new tensor of at least 8000 B 0.40000 ns more (probe)"));
        let err = super::tests::set(&FP16.replacen(
            "\"bytes_per_element\": 6",
            "\"bytes_per_element\": 6, \"fresh_bytes_per_element\": -1",
            1,
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("codecs.fp16.encode.fresh_bytes_per_element"),
            "{err}"
        );
    }

    #[test]
    fn an_implementation_counted_with_error_feedback_refuses_a_plan_without_it() {
        let ddp = CodecSet::load("pytorch-ddp").unwrap();
        let powersgd: Compressor = "powersgd:4".parse().unwrap();
        assert!(ddp.writes(&powersgd, &Memory::Residual));
        assert!(!ddp.writes(&powersgd, &Memory::None));
        // The fp16 hook has no memory: with one, DDP would not run it.
        assert!(ddp.writes(&Compressor::Fp16, &Memory::None));
        assert!(!ddp.writes(&Compressor::Fp16, &Memory::Residual));
        let err = ddp
            .check_compressors([(&Compressor::Fp16, &Memory::Residual)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`fp16` is written without error feedback")
                && err.contains("`--memory none`"),
            "{err}"
        );
        let err = ddp
            .check_compressors([(&powersgd, &Memory::None)])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`powersgd` is written with error-feedback memory `residual`")
                && err.contains("the plan's memory is `none`"),
            "{err}"
        );
        let text = FP16.replace(
            "\"source\": \"t\"",
            "\"memory\": \"amnesia\", \"source\": \"t\"",
        );
        let err = set(&text).unwrap_err().to_string();
        assert!(err.contains("codecs.fp16.memory"), "{err}");
    }

    #[test]
    fn an_unknown_op_cost_is_refused() {
        let text = r#"{"format_version": 1, "name": "s", "description": "d",
            "op_cost": "teleport", "codecs": {},
            "provenance": {"status": "estimated", "method": "test"}}"#;
        let err = data::parse_json::<CodecSet>("s.json", text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("teleport"), "{err}");
    }

    #[test]
    fn each_op_costs_the_frameworks_op_and_each_byte_the_devices_bandwidth() {
        let set = set(FP16).unwrap();
        let device = DeviceProfile::load("v100-sxm2-32gb").unwrap();
        let mut framework = Framework::load("horovod").unwrap();
        framework.op_us = 10.0;
        let priced = set.priced_on(&device, Some(&framework)).unwrap();
        let cost = priced.codec_cost("fp16").unwrap();
        assert_eq!(cost.encode.floor_us, 10.0);
        // 6 B at 900 GB/s × 0.7.
        assert!((cost.encode.ns_per_element - 6.0 / 630.0).abs() < 1e-12);
        assert_eq!(cost.aggregate, CostCurve::default());
        // One block's serial work adds its measured time per element, whatever the device.
        let serial = FP16.replacen(
            "\"bytes_per_element\": 6",
            "\"bytes_per_element\": 6, \"serial_ns_per_element\": 12.8",
            1,
        );
        let serial = super::tests::set(&serial)
            .unwrap()
            .priced_on(&device, Some(&framework))
            .unwrap();
        let encode = serial.codec_cost("fp16").unwrap().encode;
        assert!((encode.ns_per_element - (6.0 / 630.0 + 12.8)).abs() < 1e-12);
        // Compressors the set does not write keep the device's curves.
        assert_eq!(
            priced.codec_cost("dgc").unwrap(),
            device.codec_cost("dgc").unwrap()
        );
    }
}
