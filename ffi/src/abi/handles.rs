//! Opaque handles: the id table behind every handle, how a handle is
//! borrowed or taken back from C, and out-pointers.
//!
//! A handle given to C is not an address: it is an id into a process-wide
//! table (a never-reused 64-bit counter, shown to C as an opaque pointer).
//! The table maps a live id to its kind and its heap object. Destroying a
//! handle removes its id, so a stale handle (used after its destroy, even
//! when a new handle of the same kind has been created since) and a handle
//! of another kind are both reported as `ftnInvalidArgument` instead of
//! aliasing another object; an arbitrary value is never dereferenced.

use std::collections::BTreeMap;
use std::sync::Mutex;

use ferrotron::Result;

use crate::abi::boundary::invalid;

/// Every handle type: a kind tag and the name of its C type.
pub(crate) trait Handle {
    const MAGIC: u64;
    const KIND: &'static str;
}

/// The table of live handles: id -> (kind tag, address of the boxed object).
struct Table {
    next: u64,
    live: BTreeMap<u64, (u64, usize)>,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    next: 1,
    live: BTreeMap::new(),
});

fn table() -> std::sync::MutexGuard<'static, Table> {
    // The table holds plain data: a poisoned lock is still consistent.
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Moves `h` to the heap and registers it: the returned value is the new
/// handle's id (never 0, never reused), to be given to C.
pub(crate) fn register<H: Handle>(h: H) -> *mut H {
    let addr = Box::into_raw(Box::new(h)) as usize;
    let mut t = table();
    // 2^60 handles are never created: the ids stay unique and non-zero.
    let id = t.next << 4;
    t.next += 1;
    t.live.insert(id, (H::MAGIC, addr));
    id as *mut H
}

fn kind_of(magic: u64) -> &'static str {
    use crate::comm::ftnComm;
    use crate::ops::adam::ftnAdam;
    use crate::ops::grad_scaler::ftnGradScaler;
    use crate::parallel::blocks::{ftnTpAttention, ftnTpMlp};
    use crate::parallel::ddp::{ftnDdp, ftnDistOpt, ftnParamRegistry};
    use crate::parallel::linear::{ftnColumnParallelLinear, ftnRowParallelLinear};
    use crate::parallel::vocab::ftnCrossEntropySaved;
    use crate::runtime::{ftnContext, ftnEvent, ftnStream};
    macro_rules! kinds {
        ($($h:ty),*) => {
            $(if magic == <$h as Handle>::MAGIC {
                return <$h as Handle>::KIND;
            })*
        };
    }
    kinds!(
        ftnContext,
        ftnStream,
        ftnEvent,
        ftnComm,
        ftnGradScaler,
        ftnColumnParallelLinear,
        ftnRowParallelLinear,
        ftnTpMlp,
        ftnTpAttention,
        ftnCrossEntropySaved,
        ftnAdam,
        ftnParamRegistry,
        ftnDdp,
        ftnDistOpt
    );
    "another kind of handle"
}

/// The address of the live handle `p` of kind `H`, or the error naming
/// `arg`: NULL, stale (destroyed) or of another kind.
fn lookup<H: Handle>(
    op: &'static str,
    arg: &'static str,
    p: *mut H,
    remove: bool,
) -> Result<usize> {
    let expected = || format!("a live {}", H::KIND);
    if p.is_null() {
        return Err(invalid(op, arg, expected(), "NULL"));
    }
    let id = p as usize as u64;
    let mut t = table();
    match t.live.get(&id) {
        None => Err(invalid(
            op,
            arg,
            expected(),
            format!("{p:p}, a stale handle (already destroyed) or a value that is not a handle"),
        )),
        Some(&(magic, _)) if magic != H::MAGIC => Err(invalid(
            op,
            arg,
            expected(),
            format!("{p:p}, a live {}", kind_of(magic)),
        )),
        Some(&(_, addr)) => {
            if remove {
                t.live.remove(&id);
            }
            Ok(addr)
        }
    }
}

/// Borrows the handle behind `p`, checking NULL, staleness and its kind.
///
/// # Safety
/// The handle must not be destroyed while the borrow is used (the C
/// contract: a handle is not destroyed while another call uses it).
pub(crate) unsafe fn get<'a, H: Handle>(
    op: &'static str,
    arg: &'static str,
    p: *mut H,
) -> Result<&'a H> {
    let addr = lookup(op, arg, p, false)?;
    // SAFETY: a live entry of kind H holds the address of a `Box<H>` that
    // only `take` frees, after removing the entry; the caller does not
    // destroy the handle while it is borrowed.
    Ok(unsafe { &*(addr as *const H) })
}

/// Removes the handle behind `p` from the table and takes ownership of it
/// (for destroy functions): later uses of `p` are reported as stale.
///
/// # Safety
/// As [`get`]: no other call uses the handle concurrently.
pub(crate) unsafe fn take<H: Handle>(
    op: &'static str,
    arg: &'static str,
    p: *mut H,
) -> Result<Box<H>> {
    let addr = lookup(op, arg, p, true)?;
    // SAFETY: the entry (now removed, so this happens once) held the
    // address of a `Box<H>` made by `register`.
    Ok(unsafe { Box::from_raw(addr as *mut H) })
}

/// Writes `v` through an out-pointer after checking it ([`check_out`]).
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn write_out<T>(
    op: &'static str,
    arg: &'static str,
    out: *mut T,
    v: T,
) -> Result<()> {
    check_out(op, arg, out)?;
    // SAFETY: non-NULL, aligned and valid by the contract.
    unsafe { out.write(v) };
    Ok(())
}

/// Checks an out-pointer (non-NULL and aligned for `T`) before any work
/// is done.
pub(crate) fn check_out<T>(op: &'static str, arg: &'static str, out: *mut T) -> Result<()> {
    if out.is_null() {
        return Err(invalid(
            op,
            arg,
            "a non-NULL pointer to write the result to",
            "NULL",
        ));
    }
    let align = std::mem::align_of::<T>();
    if (out as usize) % align != 0 {
        return Err(invalid(
            op,
            arg,
            format!("a pointer aligned to {align} bytes to write the result to"),
            format!("{out:p}"),
        ));
    }
    Ok(())
}

/// Every handle: a child of a context (`ftn_context_destroy` refuses to
/// destroy a context while it has live children). Counts per kind.
#[derive(Default)]
pub(crate) struct Children {
    counts: Mutex<[usize; 7]>,
}

/// The kinds of a context's children.
#[derive(Clone, Copy)]
pub(crate) enum ChildKind {
    Stream = 0,
    Event = 1,
    Comm = 2,
    GradScaler = 3,
    Adam = 4,
    Ddp = 5,
    DistOpt = 6,
}

const CHILD_NAMES: [&str; 7] = [
    "streams",
    "events",
    "communicators",
    "grad scalers",
    "Adam optimizers",
    "DDPs",
    "distributed optimizers",
];

impl Children {
    /// The live children as `"2 streams, 1 events"`, or `None`.
    pub(crate) fn describe(&self) -> Option<String> {
        let c = *self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let parts: Vec<String> = c
            .iter()
            .zip(CHILD_NAMES)
            .filter(|(n, _)| **n > 0)
            .map(|(n, what)| format!("{n} {what}"))
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// Held by a child handle: counts it in its context while it lives.
pub(crate) struct Child {
    of: std::sync::Arc<Children>,
    kind: ChildKind,
}

impl Child {
    pub(crate) fn new(of: &std::sync::Arc<Children>, kind: ChildKind) -> Child {
        of.counts.lock().unwrap_or_else(|p| p.into_inner())[kind as usize] += 1;
        Child {
            of: of.clone(),
            kind,
        }
    }
}

impl Child {
    /// Another child, of `kind`, of the same context.
    pub(crate) fn sibling(&self, kind: ChildKind) -> Child {
        Child::new(&self.of, kind)
    }
}

impl Clone for Child {
    fn clone(&self) -> Child {
        Child::new(&self.of, self.kind)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let mut c = self.of.counts.lock().unwrap_or_else(|p| p.into_inner());
        c[self.kind as usize] = c[self.kind as usize].saturating_sub(1);
    }
}

/// The `handle!` macro: a handle struct with the given fields, its C alias
/// (`*mut` of it) and `into_raw` (register a new handle).
macro_rules! handle {
    ($name:ident, $alias:ident, $magic:expr, $kind:literal, { $($f:ident : $t:ty),* $(,)? }) => {
        #[allow(non_camel_case_types)]
        pub struct $name {
            $(pub(crate) $f: $t),*
        }
        #[allow(non_camel_case_types)]
        pub type $alias = *mut $name;
        impl $crate::abi::handles::Handle for $name {
            const MAGIC: u64 = $magic;
            const KIND: &'static str = $kind;
        }
        impl $name {
            pub(crate) fn into_raw($($f: $t),*) -> *mut $name {
                $crate::abi::handles::register($name { $($f),* })
            }
        }
    };
}

pub(crate) use handle;
