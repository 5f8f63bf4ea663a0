//! Checkpoints of the distributed optimizer (feature `checkpoint`, on by
//! default): the model parameters, the fp32 master weights, the Adam moments
//! and the step count, as one [safetensors](https://crates.io/crates/safetensors)
//! file of **per-parameter tensors** named by parameter name. The file does
//! not depend on the data-parallel size or the bucket size it was saved
//! with, nor on whether the optimizer was sharded (ZeRO-1) or replicated
//! (plain DDP): a checkpoint saved at dp = 4 loads at dp = 2 with other
//! buckets, and either kind loads into the other.
//!
//! Tensors (`<name>` a registered parameter name, `<shape>` its registered
//! shape):
//!
//! | tensor | dtype | shape |
//! | --- | --- | --- |
//! | `model/<name>` | the parameter dtype | `<shape>` |
//! | `optimizer/master/<name>` | F32 | `<shape>` |
//! | `optimizer/exp_avg/<name>` | F32 | `<shape>` |
//! | `optimizer/exp_avg_sq/<name>` | F32 | `<shape>` |
//! | `optimizer/step` | I64 | `[1]` |
//!
//! Saving: every rank's shard of every bucket (master, m, v packed) is
//! all-gathered over the data-parallel communicator, bucket by bucket (a
//! replicated optimizer's rank 0 already holds all of it); rank 0
//! cuts the gathered buckets at parameter boundaries, writes the file
//! (through a temporary file renamed into place) and broadcasts whether that
//! worked, so every rank returns the same verdict. Loading: every rank reads
//! the file, checks it against its model, and takes the slices of its own
//! segments (a scatter through the shared file system; no collective).
//! Values are stored little-endian.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::backend::{AnyBuffer, Stream};
use crate::core::ddp_layout;
use crate::core::dtype::{bf16, f16};
use crate::core::{DType, Error, Result};
use crate::ops::adam::AdamScalars;

use super::buffers::{view_any, ParamId};
use super::dist_opt::DistributedOptimizer;
use super::reducer::DistributedDataParallel;

const SAVE: &str = "save_checkpoint";
const LOAD: &str = "load_checkpoint";

/// The format tag written into the file's metadata.
pub const CHECKPOINT_FORMAT: &str = "ferrotron-dist-opt-v1";

const STATE: [&str; 3] = ["master", "exp_avg", "exp_avg_sq"];
const STEP_TENSOR: &str = "optimizer/step";

fn model_name(name: &str) -> String {
    format!("model/{name}")
}

fn state_name(kind: &str, name: &str) -> String {
    format!("optimizer/{kind}/{name}")
}

fn st_dtype(d: DType) -> Result<Dtype> {
    Ok(match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        other => return Err(Error::invalid(SAVE, "param", "f32, f16 or bf16", other)),
    })
}

/// The raw little-endian bytes of a float buffer (waits for the device).
fn any_to_le(b: &AnyBuffer) -> Result<Vec<u8>> {
    Ok(match b {
        AnyBuffer::F32(x) => x.to_host()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        AnyBuffer::F16(x) => x
            .to_host()?
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect(),
        AnyBuffer::BF16(x) => x
            .to_host()?
            .iter()
            .flat_map(|v| v.to_bits().to_le_bytes())
            .collect(),
        other => {
            return Err(Error::invalid(
                SAVE,
                "param",
                "f32, f16 or bf16",
                other.dtype(),
            ))
        }
    })
}

/// Writes little-endian `bytes` into a float buffer on `stream`.
fn le_to_any(stream: &Stream, bytes: &[u8], dst: &mut AnyBuffer) -> Result<()> {
    let u16s = || {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
    };
    match dst {
        AnyBuffer::F32(x) => {
            let v: Vec<f32> = f32s(bytes);
            stream.copy_from_host(&v, x)
        }
        AnyBuffer::F16(x) => {
            let v: Vec<f16> = u16s().map(f16::from_bits).collect();
            stream.copy_from_host(&v, x)
        }
        AnyBuffer::BF16(x) => {
            let v: Vec<bf16> = u16s().map(bf16::from_bits).collect();
            stream.copy_from_host(&v, x)
        }
        other => Err(Error::invalid(
            LOAD,
            "param",
            "f32, f16 or bf16",
            other.dtype(),
        )),
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn io_error(op: &'static str, path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::invalid(op, "path", what, format!("'{}': {e}", path.display()))
}

/// Saves `ddp`'s parameters and `opt`'s state (master weights, Adam `m`,
/// `v`) and `scalars`' step count to `path` as per-parameter tensors (see
/// the module docs). Every data-parallel rank must call it (collectives);
/// only rank 0 writes. Call it between steps: it synchronises `compute`
/// first. Errors: `opt` not built from `ddp`; the file cannot be written
/// (on every rank: rank 0 broadcasts the outcome).
pub fn save_checkpoint(
    ddp: &DistributedDataParallel<'_>,
    opt: &DistributedOptimizer,
    scalars: &AdamScalars,
    compute: &Stream,
    path: &Path,
) -> Result<()> {
    opt.check_built_from(SAVE, ddp)?;
    ddp.wait_param_gathers_shared(compute)?;
    let b = &ddp.buffers;
    let dev = b.device().clone();
    dev.check_same(SAVE, "compute", compute.device())?;
    let comm = ddp.comm();
    let (dp, rank) = (comm.size(), comm.rank());
    let cs = comm.stream();
    compute.synchronize()?;
    let step = scalars.step()?;

    // This rank's optimizer state, on the host.
    let states: Vec<[Vec<f32>; 3]> = opt
        .states
        .iter()
        .map(|s| Ok([s.master.to_host()?, s.m.to_host()?, s.v.to_host()?]))
        .collect::<Result<_>>()?;

    // Per parameter (rank 0 only): master, m, v of the whole tensor.
    let mut full: Vec<[Vec<f32>; 3]> = if rank == 0 {
        (0..b.num_params())
            .map(|p| {
                let n = b.info(ParamId(p)).map(|i| i.numel).unwrap_or(0);
                [vec![0f32; n], vec![0f32; n], vec![0f32; n]]
            })
            .collect()
    } else {
        Vec::new()
    };

    let sharded = ddp.config().distributed_optimizer;
    if !sharded {
        // The replicated optimizer of plain DDP: every rank holds the whole
        // state, the same on every rank; rank 0 writes its own.
        if rank == 0 {
            for s in &opt.segments {
                let (start, _) = b.param_range(ParamId(s.param))?;
                let n = s.hi - s.lo;
                for (k, dst) in full[s.param].iter_mut().enumerate() {
                    dst[s.lo - start..s.hi - start]
                        .copy_from_slice(&states[s.group][k][s.state..s.state + n]);
                }
            }
        }
    }
    let sharded_buckets = if sharded { ddp.buckets() } else { &[] };
    for &bid in sharded_buckets {
        let bucket = b.bucket(bid)?;
        let (lo, hi) = ddp_layout::shard(bucket, dp, rank)?;
        let sz = hi - lo;
        // [master | m | v] of this rank's shard, zero in the padding.
        let mut send = vec![0f32; 3 * sz];
        for s in opt
            .segments
            .iter()
            .filter(|s| s.group == bid.group && s.lo >= lo && s.hi <= hi)
        {
            let n = s.hi - s.lo;
            for (k, st) in states[s.group].iter().enumerate() {
                send[k * sz + s.lo - lo..k * sz + s.hi - lo]
                    .copy_from_slice(&st[s.state..s.state + n]);
            }
        }
        let send = dev.upload(&send)?;
        let mut recv = dev.alloc_zeros::<f32>(dp * 3 * sz)?;
        comm.all_gather(cs, &send, &mut recv)?.synchronize()?;
        if rank != 0 {
            continue;
        }
        let recv = recv.to_host()?;
        let members = &b.groups[bid.group].members;
        for r in 0..dp {
            let (rlo, rhi) = ddp_layout::shard(bucket, dp, r)?;
            let base = r * 3 * sz;
            for &m in &bucket.params {
                let slot = b.groups[bid.group].layout.params[m];
                if let Some((a, z)) = ddp_layout::overlap(&slot, (rlo, rhi)) {
                    let p = members[m];
                    for (k, dst) in full[p].iter_mut().enumerate() {
                        dst[a - slot.start..z - slot.start].copy_from_slice(
                            &recv[base + k * sz + a - rlo..base + k * sz + z - rlo],
                        );
                    }
                }
            }
        }
    }

    let written = if rank == 0 {
        write_file(ddp, &full, step, path)
    } else {
        Ok(())
    };
    // Every rank learns whether rank 0 wrote the file.
    let mut flag = dev.upload(&[if written.is_ok() { 1f32 } else { 0f32 }])?;
    comm.broadcast(cs, &mut flag, 0)?.synchronize()?;
    written?;
    if flag.to_host()?[0] != 1.0 {
        return Err(io_error(
            SAVE,
            path,
            "a file rank 0 can write",
            "rank 0 could not write it",
        ));
    }
    Ok(())
}

fn write_file(
    ddp: &DistributedDataParallel<'_>,
    full: &[[Vec<f32>; 3]],
    step: i32,
    path: &Path,
) -> Result<()> {
    let b = &ddp.buffers;
    let mut tensors = HostTensors::default();
    for (p, st) in full.iter().enumerate() {
        let id = ParamId(p);
        let info = b.info(id)?;
        let (g, _) = b.place(p);
        let pbuf = b.groups[g].param.as_ref().ok_or_else(|| {
            Error::invalid(SAVE, "ddp", "parameter buffers", "gradient-only buffers")
        })?;
        let (start, end) = b.param_range(id)?;
        // SAFETY: the parameter's slot lies in its group's parameter buffer,
        // read (host-synchronously) while `ddp` is borrowed.
        let view = unsafe { view_any(pbuf, start, end - start) }?;
        tensors.push(
            model_name(&info.name),
            st_dtype(info.param_dtype)?,
            info.shape.clone(),
            any_to_le(&view)?,
        );
        for (k, kind) in STATE.iter().enumerate() {
            tensors.push(
                state_name(kind, &info.name),
                Dtype::F32,
                info.shape.clone(),
                st[k].iter().flat_map(|v| v.to_le_bytes()).collect(),
            );
        }
    }
    tensors.push_step(step);
    let cfg = ddp.buffers.config();
    tensors.write(
        path,
        &[
            ("saved_dp", cfg.dp.to_string()),
            ("saved_bucket_size", cfg.bucket_size.to_string()),
        ],
    )
}

/// One stored tensor: its dtype, shape and little-endian bytes.
pub(crate) struct TensorRef<'a> {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: &'a [u8],
}

/// Where a checkpoint's tensors are read from: a parsed file, or tensors
/// built in memory ([`HostTensors`], e.g. a checkpoint resharded for
/// another model-parallel layout).
pub(crate) trait CheckpointSource {
    /// The tensor called `name`, if there is one.
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>>;
    /// Every tensor's name.
    fn names(&self) -> Vec<&str>;
}

impl CheckpointSource for SafeTensors<'_> {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        SafeTensors::tensor(self, name).ok().map(|t| TensorRef {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            data: t.data(),
        })
    }
    fn names(&self) -> Vec<&str> {
        SafeTensors::names(self)
            .into_iter()
            .map(|s| s.as_str())
            .collect()
    }
}

/// Checkpoint tensors held in memory, in the order they were pushed: what
/// [`save_checkpoint`] writes, and what resharding builds and hands to the
/// loader without a file in between.
#[derive(Default)]
pub(crate) struct HostTensors {
    list: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
    index: HashMap<String, usize>,
}

impl HostTensors {
    /// Adds `name` (its little-endian `bytes`); a later push of the same
    /// name replaces it.
    pub fn push(&mut self, name: String, dtype: Dtype, shape: Vec<usize>, bytes: Vec<u8>) {
        match self.index.get(&name) {
            Some(&i) => self.list[i] = (name, dtype, shape, bytes),
            None => {
                self.index.insert(name.clone(), self.list.len());
                self.list.push((name, dtype, shape, bytes));
            }
        }
    }

    /// Adds the optimizer's step count.
    pub fn push_step(&mut self, step: i32) {
        self.push(
            STEP_TENSOR.to_string(),
            Dtype::I64,
            vec![1],
            i64::from(step).to_le_bytes().to_vec(),
        );
    }

    /// Writes the tensors to `path` as a safetensors file with the format
    /// tag and `meta` in its metadata, through a temporary file renamed
    /// into place (a reader never sees half a file).
    pub fn write(&self, path: &Path, meta: &[(&str, String)]) -> Result<()> {
        let views = self
            .list
            .iter()
            .map(|(n, d, s, bytes)| {
                TensorView::new(*d, s.clone(), bytes)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| Error::invalid(SAVE, "param", "a tensor safetensors accepts", e))
            })
            .collect::<Result<Vec<_>>>()?;
        let meta: HashMap<String, String> = [("format", CHECKPOINT_FORMAT.to_string())]
            .into_iter()
            .chain(meta.iter().cloned())
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let bytes = safetensors::serialize(views, &Some(meta))
            .map_err(|e| io_error(SAVE, path, "a checkpoint safetensors can serialise", e))?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, &bytes).map_err(|e| io_error(SAVE, path, "a writable file", e))?;
        std::fs::rename(&tmp, path).map_err(|e| io_error(SAVE, path, "a writable file", e))
    }
}

impl CheckpointSource for HostTensors {
    fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        self.index.get(name).map(|&i| {
            let (_, dtype, shape, bytes) = &self.list[i];
            TensorRef {
                dtype: *dtype,
                shape: shape.clone(),
                data: bytes,
            }
        })
    }
    fn names(&self) -> Vec<&str> {
        self.list.iter().map(|t| t.0.as_str()).collect()
    }
}

/// Checks that `t` exists in `st` with `dtype` and `shape`.
fn expect<'a>(
    st: &'a dyn CheckpointSource,
    name: &str,
    dtype: Dtype,
    shape: &[usize],
) -> Result<TensorRef<'a>> {
    let t = st.tensor(name).ok_or_else(|| {
        Error::invalid(
            LOAD,
            "checkpoint",
            format!("a checkpoint of this model (a tensor '{name}')"),
            format!("missing tensor '{name}' (a checkpoint of another model?)"),
        )
    })?;
    if t.dtype != dtype {
        return Err(Error::invalid(
            LOAD,
            "checkpoint",
            format!("tensor '{name}' of dtype {dtype:?}"),
            format!("dtype {:?} (a checkpoint of another model?)", t.dtype),
        ));
    }
    if t.shape != shape {
        return Err(Error::invalid(
            LOAD,
            "checkpoint",
            format!("tensor '{name}' of shape {shape:?}"),
            format!("shape {:?} (a checkpoint of another model?)", t.shape),
        ));
    }
    let bytes = shape.iter().product::<usize>() * dtype.size();
    if t.data.len() != bytes {
        return Err(Error::invalid(
            LOAD,
            "checkpoint",
            format!("tensor '{name}' of {bytes} bytes"),
            t.data.len(),
        ));
    }
    Ok(t)
}

/// Loads a checkpoint written by [`save_checkpoint`] (at any data-parallel
/// size and bucket size) into `ddp`'s parameter buffer, `opt`'s state for
/// this rank's segments and `scalars`' step count, enqueued on `compute`.
/// Call it between steps, after building `opt` from `ddp`. Every rank reads
/// the whole file. Errors, before anything is written: an unreadable file or
/// not a safetensors file (`path`); a checkpoint of another model — a
/// missing or extra tensor, a wrong shape or dtype (`checkpoint`, naming the
/// tensor); `opt` not built from `ddp`.
pub fn load_checkpoint(
    ddp: &mut DistributedDataParallel<'_>,
    opt: &mut DistributedOptimizer,
    scalars: &mut AdamScalars,
    compute: &Stream,
    path: &Path,
) -> Result<()> {
    let bytes =
        std::fs::read(path).map_err(|e| io_error(LOAD, path, "a readable checkpoint file", e))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| io_error(LOAD, path, "a safetensors file", e))?;
    load_checkpoint_from(ddp, opt, scalars, compute, &st)
}

/// [`load_checkpoint`] from tensors already read (a parsed file, or
/// tensors built in memory): the same checks, in the same order, before
/// anything is written.
pub(crate) fn load_checkpoint_from(
    ddp: &mut DistributedDataParallel<'_>,
    opt: &mut DistributedOptimizer,
    scalars: &mut AdamScalars,
    compute: &Stream,
    st: &dyn CheckpointSource,
) -> Result<()> {
    opt.check_built_from(LOAD, ddp)?;
    ddp.finish_param_gather(compute)?;
    let b = &ddp.buffers;
    b.device().check_same(LOAD, "compute", compute.device())?;

    // Validate everything first.
    let mut known: HashSet<String> = HashSet::new();
    let mut model = Vec::with_capacity(b.num_params());
    let mut state: Vec<[TensorRef<'_>; 3]> = Vec::with_capacity(b.num_params());
    for p in 0..b.num_params() {
        let info = b.info(ParamId(p))?;
        let mn = model_name(&info.name);
        model.push(expect(st, &mn, st_dtype(info.param_dtype)?, &info.shape)?);
        known.insert(mn);
        let mut k3 = Vec::with_capacity(3);
        for kind in STATE {
            let n = state_name(kind, &info.name);
            k3.push(expect(st, &n, Dtype::F32, &info.shape)?);
            known.insert(n);
        }
        let [a, m, v]: [TensorRef<'_>; 3] = k3
            .try_into()
            .map_err(|_| Error::invalid(LOAD, "checkpoint", "three optimizer tensors", "fewer"))?;
        state.push([a, m, v]);
    }
    let step_t = expect(st, STEP_TENSOR, Dtype::I64, &[1])?;
    known.insert(STEP_TENSOR.to_string());
    let mut names = st.names();
    names.sort_unstable();
    if let Some(extra) = names.iter().find(|n| !known.contains(**n)) {
        return Err(Error::invalid(
            LOAD,
            "checkpoint",
            "a checkpoint of this model (only its tensors)",
            format!("extra tensor '{extra}' (a checkpoint of another model?)"),
        ));
    }
    let sd = step_t.data;
    let step = i64::from_le_bytes(
        sd.try_into()
            .map_err(|_| Error::invalid(LOAD, "checkpoint", "an 8-byte step count", sd.len()))?,
    );
    let step = i32::try_from(step)
        .ok()
        .filter(|s| *s >= 0)
        .ok_or_else(|| Error::invalid(LOAD, "checkpoint", "a step count in 0..=i32::MAX", step))?;

    // This rank's segments of master, m, v.
    for (g, gs) in opt.states.iter_mut().enumerate() {
        let len = gs.master.len();
        let mut host = [vec![0f32; len], vec![0f32; len], vec![0f32; len]];
        for s in opt.segments.iter().filter(|s| s.group == g) {
            let (start, _) = b.param_range(ParamId(s.param))?;
            let (a, z) = (s.lo - start, s.hi - start);
            for (k, h) in host.iter_mut().enumerate() {
                let data = &state[s.param][k].data[4 * a..4 * z];
                h[s.state..s.state + (z - a)].copy_from_slice(&f32s(data));
            }
        }
        let [hm, ha, hv] = host;
        compute.copy_from_host(&hm, &mut gs.master)?;
        compute.copy_from_host(&ha, &mut gs.m)?;
        compute.copy_from_host(&hv, &mut gs.v)?;
    }
    // The (replicated) parameters.
    for (p, t) in model.iter().enumerate() {
        let (g, _) = b.place(p);
        let pbuf = b.groups[g]
            .param
            .as_ref()
            .ok_or_else(|| Error::invalid(LOAD, "ddp", "parameter buffers", "none"))?;
        let (start, end) = b.param_range(ParamId(p))?;
        // SAFETY: the slot lies in the group's parameter buffer; the copy is
        // enqueued on `compute` while `ddp` is borrowed and the buffers'
        // drop is stream-ordered.
        let mut view = unsafe { view_any(pbuf, start, end - start) }?;
        le_to_any(compute, t.data, &mut view)?;
    }
    scalars.set_step(compute, step)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// In-memory tensors are checked like a file's: name, dtype, shape, and
    /// a byte count that matches the shape (a short tensor is a named
    /// error, not a slice past its end).
    #[test]
    fn in_memory_tensors_are_checked_like_a_file() {
        let mut t = HostTensors::default();
        t.push("a".into(), Dtype::F32, vec![2], f32_bytes(&[1.0, 2.0]));
        t.push("short".into(), Dtype::F32, vec![3], f32_bytes(&[1.0, 2.0]));
        t.push_step(7);
        assert_eq!(expect(&t, "a", Dtype::F32, &[2]).unwrap().data.len(), 8);
        let msg = |r: Result<TensorRef<'_>>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg(expect(&t, "b", Dtype::F32, &[2])).contains("missing tensor 'b'"));
        assert!(msg(expect(&t, "a", Dtype::F16, &[2])).contains("dtype F32"));
        assert!(msg(expect(&t, "a", Dtype::F32, &[3])).contains("shape [2]"));
        assert!(msg(expect(&t, "short", Dtype::F32, &[3])).contains("12 bytes"));
        let step = expect(&t, STEP_TENSOR, Dtype::I64, &[1]).unwrap();
        assert_eq!(step.data, 7i64.to_le_bytes());
        // A second push of a name replaces the first, in place.
        t.push("a".into(), Dtype::F32, vec![1], f32_bytes(&[3.0]));
        assert_eq!(t.names(), ["a", "short", STEP_TENSOR]);
        assert_eq!(
            expect(&t, "a", Dtype::F32, &[1]).unwrap().data,
            f32_bytes(&[3.0])
        );
    }

    /// What `HostTensors::write` writes reads back through the file path
    /// with the same bytes, the format tag and the given metadata.
    #[test]
    fn written_tensors_read_back() {
        let mut t = HostTensors::default();
        t.push(
            "w".into(),
            Dtype::F32,
            vec![2, 2],
            f32_bytes(&[1.0, -2.0, 3.5, 0.25]),
        );
        t.push_step(3);
        let path = std::env::temp_dir().join(format!("ftn-host-tensors-{}.st", std::process::id()));
        t.write(&path, &[("saved_dp", "4".into())]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        let meta = meta.metadata().clone().unwrap_or_default();
        assert_eq!(
            meta.get("format").map(String::as_str),
            Some(CHECKPOINT_FORMAT)
        );
        assert_eq!(meta.get("saved_dp").map(String::as_str), Some("4"));
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let w = expect(&st, "w", Dtype::F32, &[2, 2]).unwrap();
        assert_eq!(w.data, f32_bytes(&[1.0, -2.0, 3.5, 0.25]));
        assert_eq!(CheckpointSource::names(&st).len(), 2);
    }
}
