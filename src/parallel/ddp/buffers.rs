//! Contiguous parameter and gradient buffers (Megatron-Core's
//! `ParamAndGradBuffer`): parameters are registered by name and shape, then
//! one gradient buffer is allocated per (param dtype, grad dtype) group,
//! laid out by [`crate::core::ddp_layout`] (reverse registration order,
//! buckets, distributed-optimizer padding). Each parameter's gradient (and,
//! with the distributed optimizer, its value) is a [`BufferView`]: a
//! `DeviceBuffer` into the contiguous buffer, so kernels such as a `beta = 1`
//! weight-gradient GEMM accumulate straight into it.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::Deref;

use crate::backend::{AnyBuffer, Device, DeviceBuffer};
use crate::core::ddp_layout::{self, GroupLayout, LayoutConfig};
use crate::core::{DType, Element, Error, Result};

const OP: &str = "ParamAndGradBuffers";

/// A registered parameter (index in registration order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamId(pub(crate) usize);

impl ParamId {
    /// The registration index.
    pub fn index(self) -> usize {
        self.0
    }
}

/// How a parameter's gradient relates to the tensor-parallel group, i.e.
/// whether [`crate::parallel::ddp::DistributedDataParallel::finalize_model_grads`]
/// must still all-reduce it over the tensor-parallel ranks. Every gradient
/// must be summed over the TP group **exactly once**; which layers already
/// did it:
///
/// | ferrotron layer | parameter | gradient as the layer returns it | kind |
/// | --- | --- | --- | --- |
/// | `ColumnParallelLinear` | weight, bias shard | complete for this rank's shard | `Local` |
/// | `RowParallelLinear` | weight shard | complete for this rank's shard | `Local` |
/// | `RowParallelLinear` | replicated bias, **with** sequence parallelism | **already summed over TP** (column sums of the all-gathered `dY`) | `Local` |
/// | `RowParallelLinear` | replicated bias, without sequence parallelism | complete (every rank sees every token) | `Local` |
/// | `TpMlp` | fc1 / fc2 as above (fc2's bias already summed under SP) | | `Local` |
/// | `LayerNorm` / `RmsNorm` on sequence-parallel rows | gamma, beta (replicated) | partial: this rank's `tokens / tp` rows only | `TpDuplicated` |
/// | any replicated parameter used only on this rank's sequence shard | | partial | `TpDuplicated` |
///
/// (Megatron-Core leaves the row-parallel bias gradient as a per-rank
/// partial under sequence parallelism and all-reduces it with the
/// LayerNorm gradients; ferrotron's row-parallel layer already returns the
/// sum, so registering it `TpDuplicated` would double it.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// The gradient is complete on this TP rank (TP-sharded parameters, or
    /// replicated ones whose layer already summed it over TP). Default.
    #[default]
    Local,
    /// Replicated over the TP group, gradient a per-rank partial sum
    /// (sequence parallelism): all-reduced (sum) over the TP group by
    /// `finalize_model_grads`. Megatron's `sequence_parallel` attribute.
    TpDuplicated,
}

/// What was registered for one parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    pub name: String,
    pub shape: Vec<usize>,
    pub numel: usize,
    pub param_dtype: DType,
    pub grad_dtype: DType,
    pub kind: ParamKind,
}

/// The most dimensions a registered parameter may have.
pub const MAX_PARAM_DIMS: usize = 16;

/// Parameters in registration order (forward order), before allocation.
#[derive(Clone, Debug, Default)]
pub struct ParamRegistry {
    params: Vec<ParamInfo>,
    names: HashMap<String, usize>,
}

fn float(op: &'static str, arg: &'static str, d: DType) -> Result<()> {
    if matches!(d, DType::F32 | DType::F16 | DType::BF16) {
        Ok(())
    } else {
        Err(Error::invalid(op, arg, "f32, f16 or bf16", d))
    }
}

impl ParamRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a parameter with an fp32 gradient (Megatron's default).
    pub fn register(&mut self, name: &str, shape: &[usize], param_dtype: DType) -> Result<ParamId> {
        self.register_with_grad(name, shape, param_dtype, DType::F32)
    }

    /// Registers a parameter whose gradient has `grad_dtype`. Errors: a name
    /// registered before, a non-float dtype, more than [`MAX_PARAM_DIMS`]
    /// dimensions, an element count that overflows.
    pub fn register_with_grad(
        &mut self,
        name: &str,
        shape: &[usize],
        param_dtype: DType,
        grad_dtype: DType,
    ) -> Result<ParamId> {
        self.register_kind(name, shape, param_dtype, grad_dtype, ParamKind::Local)
    }

    /// Registers a parameter with its gradient dtype and [`ParamKind`]
    /// (`TpDuplicated`: a replicated parameter whose gradient
    /// `finalize_model_grads` all-reduces over the TP group). Errors as
    /// [`Self::register_with_grad`].
    pub fn register_kind(
        &mut self,
        name: &str,
        shape: &[usize],
        param_dtype: DType,
        grad_dtype: DType,
        kind: ParamKind,
    ) -> Result<ParamId> {
        const REG: &str = "ParamRegistry::register";
        if self.names.contains_key(name) {
            return Err(Error::invalid(
                REG,
                "name",
                "a parameter name not registered before",
                format!("'{name}' (registered twice)"),
            ));
        }
        float(REG, "param_dtype", param_dtype)?;
        float(REG, "grad_dtype", grad_dtype)?;
        if shape.len() > MAX_PARAM_DIMS {
            return Err(Error::invalid(
                REG,
                "shape",
                format!("at most {MAX_PARAM_DIMS} dimensions"),
                shape.len(),
            ));
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                Error::invalid(
                    REG,
                    "shape",
                    "an element count that fits in usize",
                    format!("{shape:?}"),
                )
            })?;
        let id = self.params.len();
        self.params.push(ParamInfo {
            name: name.to_string(),
            shape: shape.to_vec(),
            numel,
            param_dtype,
            grad_dtype,
            kind,
        });
        self.names.insert(name.to_string(), id);
        Ok(ParamId(id))
    }

    pub fn len(&self) -> usize {
        self.params.len()
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }
}

/// A borrowed `DeviceBuffer` view into a contiguous buffer, valid while the
/// buffers it was taken from are borrowed.
///
/// It reads as a `&DeviceBuffer` and writes as a [`DeviceWrite`]
/// (every op's output type), but never lends `&mut DeviceBuffer`: the
/// non-owning buffer inside could otherwise be swapped out and outlive the
/// borrow it depends on:
///
/// ```compile_fail,E0596
/// use ferrotron::parallel::ddp::BufferView;
/// use ferrotron::DeviceBuffer;
/// fn escape(mut v: BufferView<'_, f32>, mut owned: DeviceBuffer<f32>) {
///     std::mem::swap(&mut *v, &mut owned);
/// }
/// ```
///
/// [`DeviceWrite`]: crate::DeviceWrite
pub struct BufferView<'a, T: Element> {
    buf: DeviceBuffer<T>,
    _owner: PhantomData<&'a ()>,
}

impl<T: Element> std::fmt::Debug for BufferView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferView({:?})", self.buf)
    }
}

impl<T: Element> Deref for BufferView<'_, T> {
    type Target = DeviceBuffer<T>;
    fn deref(&self) -> &DeviceBuffer<T> {
        &self.buf
    }
}

impl<'a, T: Element> BufferView<'a, T> {
    /// The wrapped non-owning buffer, mutably, for this crate's view impls
    /// only: handing out `&mut DeviceBuffer` publicly would let safe code
    /// `mem::swap` the non-owning buffer out past the borrow it depends on.
    pub(crate) fn inner_mut(&mut self) -> &mut DeviceBuffer<T> {
        &mut self.buf
    }
}

/// One (param dtype, grad dtype) group: its members (registration order),
/// layout and buffers.
pub(crate) struct Group {
    pub param_dtype: DType,
    pub grad_dtype: DType,
    /// Global parameter ids of the members, in registration order; member
    /// `i` is `layout.params[i]`.
    pub members: Vec<usize>,
    pub layout: GroupLayout,
    pub grad: AnyBuffer,
    /// The parameter buffer (distributed optimizer only).
    pub param: Option<AnyBuffer>,
}

/// A bucket: its group and index within the group's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BucketId {
    pub group: usize,
    pub index: usize,
}

/// The allocated buffers of every group.
pub struct ParamAndGradBuffers {
    device: Device,
    params: Vec<ParamInfo>,
    names: HashMap<String, usize>,
    /// Per parameter: (group, member index).
    place: Vec<(usize, usize)>,
    pub(crate) groups: Vec<Group>,
    config: LayoutConfig,
}

impl std::fmt::Debug for ParamAndGradBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ParamAndGradBuffers({} params, {} groups, {:?})",
            self.params.len(),
            self.groups.len(),
            self.config
        )
    }
}

/// A typed view of `len` elements at element `start` of `buf`.
///
/// # Safety
/// The caller ties the view's use to a borrow of the owner of `buf` and
/// `start + len <= buf.len()`.
pub(crate) unsafe fn view_any(buf: &AnyBuffer, start: usize, len: usize) -> Result<AnyBuffer> {
    if start.checked_add(len).is_none_or(|end| end > buf.len()) {
        return Err(Error::invalid(
            OP,
            "range",
            format!("a range inside the buffer's {} elements", buf.len()),
            format!("{start} + {len}"),
        ));
    }
    let addr = buf.addr() + (start * buf.dtype().size()) as u64;
    // SAFETY: in bounds of `buf` (caller), aligned (an allocation of the
    // dtype plus a whole number of elements), alive as long as the caller's
    // borrow of its owner.
    unsafe { AnyBuffer::from_raw_parts(buf.device(), buf.dtype(), addr, len) }
}

impl ParamAndGradBuffers {
    /// Lays out and allocates (zeroed) the buffers for `registry` on
    /// `device`. `config.distributed_optimizer` also allocates parameter
    /// buffers. Errors: an empty registry, `bucket_size` or `dp` 0.
    pub fn new(device: &Device, registry: ParamRegistry, config: LayoutConfig) -> Result<Self> {
        if registry.is_empty() {
            return Err(Error::invalid(
                OP,
                "registry",
                "at least one parameter",
                "none",
            ));
        }
        let mut groups: Vec<Group> = Vec::new();
        let mut place = vec![(0, 0); registry.params.len()];
        for (id, p) in registry.params.iter().enumerate() {
            let key = (p.param_dtype, p.grad_dtype);
            let g = match groups
                .iter()
                .position(|g| (g.param_dtype, g.grad_dtype) == key)
            {
                Some(g) => g,
                None => {
                    groups.push(Group {
                        param_dtype: key.0,
                        grad_dtype: key.1,
                        members: Vec::new(),
                        layout: GroupLayout {
                            params: Vec::new(),
                            buckets: Vec::new(),
                            numel: 0,
                        },
                        // Replaced once the layout is known.
                        grad: AnyBuffer::zeros(device, key.1, 0)?,
                        param: None,
                    });
                    groups.len() - 1
                }
            };
            place[id] = (g, groups[g].members.len());
            groups[g].members.push(id);
        }
        for g in &mut groups {
            let numels: Vec<usize> = g
                .members
                .iter()
                .map(|&i| registry.params[i].numel)
                .collect();
            g.layout = ddp_layout::layout(&numels, config)?;
            g.grad = AnyBuffer::zeros(device, g.grad_dtype, g.layout.numel)?;
            if config.distributed_optimizer {
                g.param = Some(AnyBuffer::zeros(device, g.param_dtype, g.layout.numel)?);
            }
        }
        Ok(ParamAndGradBuffers {
            device: device.clone(),
            params: registry.params,
            names: registry.names,
            place,
            groups,
            config,
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes of device memory the buffers own: every group's gradient
    /// buffer and (distributed optimizer) parameter buffer, padding
    /// included.
    pub fn memory_bytes(&self) -> usize {
        self.groups
            .iter()
            .map(|g| {
                g.grad.len() * g.grad_dtype.size()
                    + g.param
                        .as_ref()
                        .map_or(0, |p| p.len() * g.param_dtype.size())
            })
            .sum()
    }

    /// Elements of every group's buffer, padding included (the sum over
    /// groups of the layout's length).
    pub fn padded_elements(&self) -> usize {
        self.groups.iter().map(|g| g.layout.numel).sum()
    }

    pub fn config(&self) -> LayoutConfig {
        self.config
    }

    pub fn num_params(&self) -> usize {
        self.params.len()
    }

    /// The id of the parameter registered as `name`.
    pub fn id(&self, name: &str) -> Result<ParamId> {
        self.names.get(name).map(|&i| ParamId(i)).ok_or_else(|| {
            Error::invalid(
                OP,
                "name",
                "a registered parameter name",
                format!("'{name}' (unknown parameter)"),
            )
        })
    }

    /// Checks that `id` belongs to these buffers.
    pub fn check(&self, op: &'static str, id: ParamId) -> Result<()> {
        if id.0 >= self.params.len() {
            return Err(Error::invalid(
                op,
                "param",
                format!("a parameter id in 0..{}", self.params.len()),
                format!("{} (unknown parameter)", id.0),
            ));
        }
        Ok(())
    }

    pub fn info(&self, id: ParamId) -> Result<&ParamInfo> {
        self.check(OP, id)?;
        Ok(&self.params[id.0])
    }

    pub(crate) fn name(&self, id: usize) -> &str {
        &self.params[id].name
    }

    /// The (group, member) of a checked parameter id.
    pub(crate) fn place(&self, id: usize) -> (usize, usize) {
        self.place[id]
    }

    /// The bucket holding `id`'s gradient.
    pub fn bucket_of(&self, id: ParamId) -> Result<BucketId> {
        self.check(OP, id)?;
        let (g, m) = self.place[id.0];
        Ok(BucketId {
            group: g,
            index: self.groups[g].layout.params[m].bucket,
        })
    }

    /// Every bucket, group by group, in reduction order.
    pub fn buckets(&self) -> Vec<BucketId> {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(g, grp)| {
                (0..grp.layout.buckets.len()).map(move |index| BucketId { group: g, index })
            })
            .collect()
    }

    /// The parameters of a bucket (layout order).
    pub fn bucket_params(&self, b: BucketId) -> Result<Vec<ParamId>> {
        let bucket = self.bucket(b)?;
        let members = &self.groups[b.group].members;
        Ok(bucket.params.iter().map(|&m| ParamId(members[m])).collect())
    }

    /// Elements `[start, end)` of the bucket in its group's buffer.
    pub fn bucket_range(&self, b: BucketId) -> Result<(usize, usize)> {
        let bucket = self.bucket(b)?;
        Ok((bucket.start, bucket.end))
    }

    /// Elements `[start, end)` of parameter `id` in its group's buffer.
    pub fn param_range(&self, id: ParamId) -> Result<(usize, usize)> {
        self.check(OP, id)?;
        let (g, m) = self.place[id.0];
        let s = self.groups[g].layout.params[m];
        Ok((s.start, s.end()))
    }

    pub(crate) fn bucket(&self, b: BucketId) -> Result<&ddp_layout::BucketRange> {
        self.groups
            .get(b.group)
            .and_then(|g| g.layout.buckets.get(b.index))
            .ok_or_else(|| {
                Error::invalid(OP, "bucket", "a bucket of these buffers", format!("{b:?}"))
            })
    }

    /// The whole gradient buffer of group `group` (its buckets, padding
    /// included), as a view.
    pub fn group_grad<T: Element>(&self, group: usize) -> Result<BufferView<'_, T>> {
        let g = self.groups.get(group).ok_or_else(|| {
            Error::invalid(
                OP,
                "group",
                format!("a group in 0..{}", self.groups.len()),
                group,
            )
        })?;
        self.typed(&g.grad, 0, g.layout.numel, "grad")
    }

    /// The number of (param dtype, grad dtype) groups.
    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// `id`'s gradient: a view of its range of the contiguous buffer. `T`
    /// must be the registered grad dtype.
    pub fn grad<T: Element>(&self, id: ParamId) -> Result<BufferView<'_, T>> {
        self.check(OP, id)?;
        let (g, m) = self.place[id.0];
        let s = self.groups[g].layout.params[m];
        self.typed(&self.groups[g].grad, s.start, s.numel, "grad")
    }

    /// `id`'s value in the parameter buffer (distributed optimizer only).
    /// `T` must be the registered param dtype.
    pub fn param<T: Element>(&self, id: ParamId) -> Result<BufferView<'_, T>> {
        self.check(OP, id)?;
        let (g, m) = self.place[id.0];
        let s = self.groups[g].layout.params[m];
        let buf = self.groups[g].param.as_ref().ok_or_else(|| {
            Error::invalid(
                OP,
                "param",
                "buffers allocated for the distributed optimizer (which hold the parameters)",
                "gradient-only buffers",
            )
        })?;
        self.typed(buf, s.start, s.numel, "param")
    }

    fn typed<T: Element>(
        &self,
        buf: &AnyBuffer,
        start: usize,
        len: usize,
        arg: &'static str,
    ) -> Result<BufferView<'_, T>> {
        if buf.dtype() != T::DTYPE {
            return Err(Error::invalid(
                OP,
                arg,
                format!("a view of {}", buf.dtype()),
                format!("a view of {}", T::DTYPE),
            ));
        }
        let addr = buf.addr() + (start * T::DTYPE.size()) as u64;
        // SAFETY: [start, start + len) lies in `buf` (a layout slot or the
        // whole layout); the address is aligned for T (an allocation of T
        // plus whole elements); the view borrows `self`, which owns `buf`.
        let view = unsafe { DeviceBuffer::<T>::from_raw_parts(&self.device, addr, len) }?;
        Ok(BufferView {
            buf: view,
            _owner: PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_many_dimensions_are_rejected() {
        let mut r = ParamRegistry::default();
        let ok = [1usize; MAX_PARAM_DIMS];
        r.register("ok", &ok, DType::F32).unwrap();
        let e = r
            .register("bad", &[1usize; MAX_PARAM_DIMS + 1], DType::F32)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 16 dimensions"), "{e}");
    }
}
