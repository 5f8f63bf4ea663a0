//! The layout of a Megatron-style job: the rank grid
//! (`ferrotron::core::rank_grid`), communicators split along its axes, and
//! the torchrun-style rendezvous that shares an NCCL unique id
//! (`ferrotron::comm::rendezvous`).

use std::ffi::c_int;
use std::time::Duration;

use ferrotron::comm::rendezvous::{share_id, JobEnv};
use ferrotron::core::rank_grid::{Axis, Coords, RankGrid, RankOrder};
use ferrotron::Result;

use crate::abi::args::try_vec;
use crate::abi::boundary::{export, ftnResult_t, invalid};
use crate::abi::descriptors::{check_out_desc, read_desc, Desc};
use crate::abi::enums::{c_enum, parse_enum, CEnum};
use crate::abi::handles::{check_out, get, write_out};
use crate::comm::{ftnComm, ftnComm_t, ftnUniqueId_t};

/// Bits of an axis set (`axes` arguments): OR them together.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnAxis_t {
    /// Tensor parallelism.
    ftnAxisTp = 1,
    /// Context parallelism.
    ftnAxisCp = 2,
    /// Data parallelism.
    ftnAxisDp = 4,
    /// Pipeline parallelism.
    ftnAxisPp = 8,
}
c_enum!(ftnAxis_t: ftnAxisTp, ftnAxisCp, ftnAxisDp, ftnAxisPp);

/// Rank layout orders (`ftnRankGridDesc_t.order`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ftnRankOrder_t {
    /// `tp-cp-ep-dp-pp` (first fastest), Megatron-Core's default.
    ftnOrderTpCpEpDpPp = 0,
    /// `tp-cp-ep-pp-dp`.
    ftnOrderTpCpEpPpDp = 1,
}
c_enum!(ftnRankOrder_t: ftnOrderTpCpEpDpPp, ftnOrderTpCpEpPpDp);

/// A job of `world` ranks as TP x CP x DP x PP (DP is what remains:
/// `world / (tp*cp*pp)`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnRankGridDesc_t {
    /// `sizeof(ftnRankGridDesc_t)` as the caller compiled it.
    pub size: usize,
    pub world: i32,
    pub tp: i32,
    pub cp: i32,
    pub pp: i32,
    /// `ftnRankOrder_t`.
    pub order: i32,
    /// Must be 0.
    pub reserved: i32,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnRankGridDesc_t {
    const NAME: &'static str = "ftnRankGridDesc_t";
    const V1_SIZE: usize = 32;
}

/// A rank's position on every axis of a grid.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnRankCoords_t {
    /// `sizeof(ftnRankCoords_t)` as the caller compiled it (set it).
    pub size: usize,
    pub tp: i32,
    pub cp: i32,
    pub dp: i32,
    pub pp: i32,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnRankCoords_t {
    const NAME: &'static str = "ftnRankCoords_t";
    const V1_SIZE: usize = 24;
}

fn nonneg(op: &'static str, arg: &'static str, v: i32) -> Result<usize> {
    usize::try_from(v).map_err(|_| invalid(op, arg, ">= 0", v))
}

/// # Safety
/// `desc` is NULL or a valid descriptor.
unsafe fn grid(op: &'static str, desc: *const ftnRankGridDesc_t) -> Result<RankGrid> {
    // SAFETY: descriptor contract.
    let d = unsafe { read_desc(op, "desc", desc)? };
    if d.reserved != 0 {
        return Err(invalid(op, "desc.reserved", "0", d.reserved));
    }
    let order = match parse_enum(op, "desc.order", d.order)? {
        ftnRankOrder_t::ftnOrderTpCpEpDpPp => RankOrder::TpCpEpDpPp,
        ftnRankOrder_t::ftnOrderTpCpEpPpDp => RankOrder::TpCpEpPpDp,
    };
    RankGrid::new(
        nonneg(op, "desc.world", d.world)?,
        nonneg(op, "desc.tp", d.tp)?,
        nonneg(op, "desc.cp", d.cp)?,
        nonneg(op, "desc.pp", d.pp)?,
        order,
    )
}

fn axes_of(op: &'static str, mask: c_int) -> Result<Vec<Axis>> {
    let all = ftnAxis_t::ALL.iter().fold(0, |m, a| m | a.value());
    if mask <= 0 || mask & !all != 0 {
        return Err(invalid(
            op,
            "axes",
            format!(
                "a non-empty OR of {} (1..={all})",
                ftnAxis_t::ALL
                    .iter()
                    .map(|a| format!("{a:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            mask,
        ));
    }
    Ok(ftnAxis_t::ALL
        .iter()
        .filter(|a| mask & a.value() != 0)
        .map(|a| match a {
            ftnAxis_t::ftnAxisTp => Axis::Tp,
            ftnAxis_t::ftnAxisCp => Axis::Cp,
            ftnAxis_t::ftnAxisDp => Axis::Dp,
            ftnAxis_t::ftnAxisPp => Axis::Pp,
        })
        .collect())
}

fn rank_of(op: &'static str, rank: c_int) -> Result<usize> {
    usize::try_from(rank).map_err(|_| invalid(op, "rank", "a rank >= 0", rank))
}

/// The grid's data-parallel size (what remains of `world`), after validating it.
///
/// Bad input (ftnInvalidArgument, nothing written): `desc` NULL,
/// misaligned, a bad `desc->size`, non-zero bytes past the known fields or
/// a non-zero `reserved`; `order` outside `ftnRankOrder_t`; `world`, `tp`,
/// `cp` or `pp` below 1; `world` not a multiple of `tp*cp*pp`; `dp` NULL or
/// not aligned for an `int`.
#[no_mangle]
pub unsafe extern "C" fn ftn_rank_grid_dp(
    desc: *const ftnRankGridDesc_t,
    dp: *mut c_int,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contract.
        let g = unsafe { grid(op, desc)? };
        // SAFETY: out-pointer contract.
        unsafe { write_out(op, "dp", dp, g.dp as c_int) }
    })
}

/// The coordinates of `rank` (`coords->size` set by the caller).
///
/// Bad input (ftnInvalidArgument, nothing written): a bad grid as for
/// `ftn_rank_grid_dp`; `coords` NULL, misaligned or with a bad
/// `coords->size`; `rank` negative or `>= world`.
#[no_mangle]
pub unsafe extern "C" fn ftn_rank_grid_coords(
    desc: *const ftnRankGridDesc_t,
    rank: c_int,
    coords: *mut ftnRankCoords_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contracts.
        let g = unsafe { grid(op, desc)? };
        unsafe { check_out_desc(op, "coords", coords)? };
        let c = g.coords(rank_of(op, rank)?)?;
        // SAFETY: checked non-NULL, aligned and at least V1_SIZE bytes;
        // every coordinate is < world, which came from an i32.
        unsafe {
            (*coords).tp = c.tp as i32;
            (*coords).cp = c.cp as i32;
            (*coords).dp = c.dp as i32;
            (*coords).pp = c.pp as i32;
        }
        Ok(())
    })
}

/// The rank at `coords`.
///
/// Bad input (ftnInvalidArgument, nothing written): a bad grid as for
/// `ftn_rank_grid_dp`; `coords` NULL, misaligned, a bad `coords->size` or
/// non-zero bytes past the known fields; a coordinate negative or not below
/// its axis' size; `rank` NULL or not aligned for an `int`.
#[no_mangle]
pub unsafe extern "C" fn ftn_rank_grid_rank(
    desc: *const ftnRankGridDesc_t,
    coords: *const ftnRankCoords_t,
    rank: *mut c_int,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contracts.
        let (g, c) = unsafe { (grid(op, desc)?, read_desc(op, "coords", coords)?) };
        let r = g.rank(Coords {
            tp: nonneg(op, "coords.tp", c.tp)?,
            cp: nonneg(op, "coords.cp", c.cp)?,
            dp: nonneg(op, "coords.dp", c.dp)?,
            pp: nonneg(op, "coords.pp", c.pp)?,
        })?;
        // SAFETY: out-pointer contract.
        unsafe { write_out(op, "rank", rank, r as c_int) }
    })
}

/// The members (ascending) of `rank`'s group along `axes` (an OR of
/// `ftnAxis_t`): written to `ranks` (room for `capacity`), their number
/// to `*count`. A `capacity` too small is an error that still sets
/// `*count` (call with `ranks = NULL, capacity = 0` to ask for the size).
///
/// Bad input (ftnInvalidArgument): a bad grid as for `ftn_rank_grid_dp`,
/// `rank` negative or `>= world`, `axes` 0, negative or with bits outside
/// `ftnAxis_t`, `count` NULL or misaligned: nothing written. After `*count`
/// is written: `capacity` negative or below the group's size, or `ranks`
/// NULL / misaligned with `capacity > 0`: an error with `*count` set and
/// `ranks` untouched. `ranks = NULL, capacity = 0` is the size query.
#[no_mangle]
pub unsafe extern "C" fn ftn_rank_grid_group(
    desc: *const ftnRankGridDesc_t,
    rank: c_int,
    axes: c_int,
    ranks: *mut c_int,
    capacity: c_int,
    count: *mut c_int,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: descriptor contract.
        let g = unsafe { grid(op, desc)? };
        let base = g.coords(rank_of(op, rank)?)?;
        let axes = axes_of(op, axes)?;
        // The group's size is the product of its axes' sizes (at most
        // `world`, an int): known without scanning the world, so a huge
        // grid costs only what the caller asks to be written.
        let n: usize = axes.iter().map(|&a| g.size(a)).product();
        // SAFETY: out-pointer contract.
        unsafe { write_out(op, "count", count, n as c_int)? };
        let cap =
            usize::try_from(capacity).map_err(|_| invalid(op, "capacity", ">= 0", capacity))?;
        if ranks.is_null() && cap == 0 {
            return Ok(());
        }
        if cap < n {
            return Err(invalid(
                op,
                "capacity",
                format!("room for the group's {n} ranks"),
                capacity,
            ));
        }
        check_out(op, "ranks", ranks)?;
        // Every combination of coordinates along `axes`, the others `base`'s.
        let mut members: Vec<usize> = try_vec(op, "ranks", n)?;
        for i in 0..n {
            let (mut c, mut rest) = (base, i);
            for &a in &axes {
                let size = g.size(a);
                let v = rest % size;
                rest /= size;
                match a {
                    Axis::Tp => c.tp = v,
                    Axis::Cp => c.cp = v,
                    Axis::Dp => c.dp = v,
                    Axis::Pp => c.pp = v,
                }
            }
            members.push(g.rank(c)?);
        }
        members.sort_unstable();
        for (i, m) in members.iter().enumerate() {
            // SAFETY: `ranks` has room for `capacity >= members.len()` ints.
            unsafe { ranks.add(i).write(*m as c_int) };
        }
        Ok(())
    })
}

/// This rank's communicator for its group along `axes` of the grid (e.g.
/// `ftnAxisTp`: its tensor-parallel group) as a new handle. Every rank of
/// `comm` calls it (from its own thread) with the same grid and axes; the
/// grid's world must be `comm`'s size.
///
/// Bad input (at the call, `*newcomm` untouched): `comm` NULL, stale or of
/// another kind; a bad grid as for `ftn_rank_grid_dp`; `newcomm` NULL or
/// misaligned; `axes` 0, negative or with bits outside `ftnAxis_t`; a grid
/// whose `world` is not `comm`'s size: ftnInvalidArgument (checked before
/// joining: peers are left waiting). Ranks that pass different grids or
/// axes (the ranks all-gather them first): ftnInvalidArgument on every
/// rank, naming the first rank that differs; nothing is split and `comm`
/// stays usable. A broken communicator, or peers that do not all call
/// within the timeout or are gone: ftnBackendError, and the communicator
/// is then broken.
#[no_mangle]
pub unsafe extern "C" fn ftn_comm_split_for_grid(
    comm: ftnComm_t,
    desc: *const ftnRankGridDesc_t,
    axes: c_int,
    newcomm: *mut ftnComm_t,
) -> ftnResult_t {
    export!(|op| {
        // SAFETY: handle and descriptor contracts.
        let (c, g) = unsafe { (get::<ftnComm>(op, "comm", comm)?, grid(op, desc)?) };
        check_out(op, "newcomm", newcomm)?;
        let sub = c.comm.split_for_grid(&g, &axes_of(op, axes)?)?;
        // SAFETY: checked non-NULL.
        unsafe { newcomm.write(crate::comm::wrap(sub, c.child.clone())) };
        Ok(())
    })
}

/// A process's place in a torchrun-launched job.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ftnJobEnv_t {
    /// `sizeof(ftnJobEnv_t)` as the caller compiled it (set it).
    pub size: usize,
    pub rank: i32,
    pub world_size: i32,
    pub local_rank: i32,
    /// Always 0.
    pub reserved: i32,
}
// SAFETY: repr(C), size_t first, integer fields, no implicit padding.
unsafe impl Desc for ftnJobEnv_t {
    const NAME: &'static str = "ftnJobEnv_t";
    const V1_SIZE: usize = 24;
}

fn small(op: &'static str, arg: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| invalid(op, arg, "a value that fits in int", v))
}

/// Reads torchrun's RANK, WORLD_SIZE, LOCAL_RANK (default RANK),
/// MASTER_ADDR and MASTER_PORT into `env` (`env->size` set by the caller).
///
/// Bad input (ftnInvalidArgument, nothing written): `env` NULL, misaligned
/// or with a bad `size` (below the first version's, between versions, or
/// above `FTN_MAX_DESC_SIZE`); a variable missing or malformed (not a
/// non-negative integer, a port outside 1..=65535), `WORLD_SIZE` 0, a
/// `RANK` not below `WORLD_SIZE`, or a value that does not fit in an `int`:
/// the last error names the variable.
#[no_mangle]
pub unsafe extern "C" fn ftn_job_env_from_environment(env: *mut ftnJobEnv_t) -> ftnResult_t {
    export!(|op| {
        // SAFETY: out-struct contract.
        unsafe { check_out_desc(op, "env", env)? };
        let e = JobEnv::from_env()?;
        // SAFETY: out-struct contract.
        unsafe { write_env(op, env, &e) }
    })
}

/// # Safety
/// `out` passed [`check_out_desc`].
unsafe fn write_env(op: &'static str, out: *mut ftnJobEnv_t, e: &JobEnv) -> Result<()> {
    let (r, w, l) = (
        small(op, "RANK", e.rank)?,
        small(op, "WORLD_SIZE", e.world_size)?,
        small(op, "LOCAL_RANK", e.local_rank)?,
    );
    // SAFETY: checked non-NULL, aligned and at least V1_SIZE bytes.
    unsafe {
        (*out).rank = r;
        (*out).world_size = w;
        (*out).local_rank = l;
        (*out).reserved = 0;
    }
    Ok(())
}

/// Shares an NCCL unique id over TCP the torchrun way (the variables of
/// `ftn_job_env_from_environment`): rank 0 passes the id it created with
/// `ftn_get_unique_id` in `*id` and serves it on MASTER_ADDR:MASTER_PORT;
/// every other rank connects and receives it into `*id`. Fails with a
/// clear error after `timeout_ms` if a peer never arrives, on a busy port,
/// a wrong world size or a malformed message. `env` (optional, NULL to
/// skip) receives this process's place in the job.
///
/// Bad input (at the call, before any network use; ftnInvalidArgument,
/// nothing written): `id` NULL or misaligned; a non-NULL `env` misaligned
/// or with a bad `size`; `timeout_ms` < 1; the environment bad as for
/// `ftn_job_env_from_environment`. Network failures (a peer that never
/// arrives within `timeout_ms`, a busy port, a wrong world size, a
/// malformed message): ftnBackendError, `*id` untouched. (A RANK,
/// WORLD_SIZE or LOCAL_RANK that parses but does not fit in an `int` fails
/// only after `*id` is written, with `*env` untouched.)
#[no_mangle]
pub unsafe extern "C" fn ftn_rendezvous_share_unique_id(
    id: *mut ftnUniqueId_t,
    timeout_ms: i64,
    env: *mut ftnJobEnv_t,
) -> ftnResult_t {
    export!(|op| {
        check_out(op, "id", id)?;
        if !env.is_null() {
            // SAFETY: out-struct contract.
            unsafe { check_out_desc(op, "env", env)? };
        }
        let ms = u64::try_from(timeout_ms)
            .ok()
            .filter(|&m| m >= 1)
            .ok_or_else(|| invalid(op, "timeout_ms", "at least 1", timeout_ms))?;
        let e = JobEnv::from_env()?;
        // SAFETY: checked non-NULL; rank 0's id is its input.
        let mine = (e.rank == 0).then(|| unsafe { id.read() }.internal);
        let shared = share_id(&e, mine, Duration::from_millis(ms))?;
        // SAFETY: checked non-NULL.
        unsafe { id.write(ftnUniqueId_t { internal: shared }) };
        if !env.is_null() {
            // SAFETY: checked above.
            unsafe { write_env(op, env, &e)? };
        }
        Ok(())
    })
}
