//! Multi-process rendezvous the torchrun way: every process reads `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`; rank 0 listens on
//! MASTER_ADDR:MASTER_PORT, every other rank connects and says who it is, and
//! rank 0 answers each with a shared blob (NCCL's 128-byte unique id). Needs
//! no GPU, so it is tested with real processes on 127.0.0.1.
//!
//! Wire format (all integers little-endian): hello = magic "FTNR" | u32
//! version | u64 rank | u64 world size; reply = magic "FTNA" | u32 status
//! (0 ok, else an error follows as u32 length + UTF-8) | 128-byte id.
//! Timeouts and clear errors for a wrong world size, a busy port, a peer that
//! never arrives, duplicate or out-of-range ranks, and malformed messages.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::core::{Error, Result};

const HELLO: &[u8; 4] = b"FTNR";
const ANSWER: &[u8; 4] = b"FTNA";
const VERSION: u32 = 1;
/// The size of the shared blob (NCCL's `ncclUniqueId`).
pub const ID_BYTES: usize = 128;

fn err(message: String) -> Error {
    Error::Backend {
        backend: "rendezvous",
        message,
    }
}

/// This process's place in the job, from torchrun's variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
}

impl JobEnv {
    /// Reads RANK, WORLD_SIZE, LOCAL_RANK (default: RANK), MASTER_ADDR,
    /// MASTER_PORT; each missing or malformed one is a clear error.
    pub fn from_env() -> Result<JobEnv> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`JobEnv::from_env`] with any lookup (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<JobEnv> {
        let num = |k: &'static str| -> Result<usize> {
            let v = get(k)
                .ok_or_else(|| Error::invalid("JobEnv", k, "set in the environment", "unset"))?;
            v.trim()
                .parse()
                .map_err(|_| Error::invalid("JobEnv", k, "a non-negative integer", v))
        };
        let rank = num("RANK")?;
        let world_size = num("WORLD_SIZE")?;
        let local_rank = if get("LOCAL_RANK").is_some() {
            num("LOCAL_RANK")?
        } else {
            rank
        };
        if world_size == 0 {
            return Err(Error::invalid("JobEnv", "WORLD_SIZE", "at least 1", 0));
        }
        if rank >= world_size {
            return Err(Error::invalid(
                "JobEnv",
                "RANK",
                format!("< WORLD_SIZE = {world_size}"),
                rank,
            ));
        }
        let master_addr = get("MASTER_ADDR")
            .ok_or_else(|| Error::invalid("JobEnv", "MASTER_ADDR", "set", "unset"))?;
        let port = num("MASTER_PORT")?;
        let master_port = u16::try_from(port)
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| Error::invalid("JobEnv", "MASTER_PORT", "a port in 1..=65535", port))?;
        Ok(JobEnv {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
        })
    }

    fn master(&self) -> Result<SocketAddr> {
        (self.master_addr.as_str(), self.master_port)
            .to_socket_addrs()
            .map_err(|e| {
                err(format!(
                    "cannot resolve MASTER_ADDR {}:{}: {e}",
                    self.master_addr, self.master_port
                ))
            })?
            .next()
            .ok_or_else(|| {
                err(format!(
                    "MASTER_ADDR {} resolves to no address",
                    self.master_addr
                ))
            })
    }
}

/// Shares `id` (given on rank 0, ignored elsewhere) with every rank; returns
/// it on every rank. Fails after `timeout` if a peer never arrives.
pub fn share_id(
    env: &JobEnv,
    id: Option<[u8; ID_BYTES]>,
    timeout: Duration,
) -> Result<[u8; ID_BYTES]> {
    if env.rank == 0 {
        let id = id.ok_or_else(|| {
            Error::invalid("share_id", "id", "the id to share, on rank 0", "None")
        })?;
        serve(env, id, timeout)?;
        Ok(id)
    } else {
        join(env, timeout)
    }
}

fn serve(env: &JobEnv, id: [u8; ID_BYTES], timeout: Duration) -> Result<()> {
    let addr = env.master()?;
    let listener = TcpListener::bind(addr).map_err(|e| {
        err(format!(
            "rank 0 cannot listen on {addr} (MASTER_ADDR:MASTER_PORT): {e}{}",
            if e.kind() == std::io::ErrorKind::AddrInUse {
                " — the port is busy; pick another MASTER_PORT"
            } else {
                ""
            }
        ))
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| err(format!("listener: {e}")))?;
    let deadline = Instant::now() + timeout;
    let mut joined: Vec<Option<TcpStream>> = (0..env.world_size).map(|_| None).collect();
    let mut count = 1; // rank 0 itself
    while count < env.world_size {
        match listener.accept() {
            Ok((mut s, peer)) => {
                s.set_nonblocking(false)
                    .map_err(|e| err(format!("{peer}: {e}")))?;
                s.set_read_timeout(Some(Duration::from_secs(5).min(timeout)))
                    .ok();
                match read_hello(&mut s) {
                    Ok((rank, world)) => {
                        let problem = if world != env.world_size as u64 {
                            Some(format!(
                                "rank {rank} at {peer} says WORLD_SIZE={world}, rank 0 has {}",
                                env.world_size
                            ))
                        } else if rank == 0 || rank >= world {
                            Some(format!("{peer} claims rank {rank}, outside 1..{world}"))
                        } else if joined[rank as usize].is_some() {
                            Some(format!("rank {rank} joined twice (second from {peer})"))
                        } else {
                            None
                        };
                        if let Some(p) = problem {
                            let _ = write_answer(&mut s, Err(&p));
                            return Err(err(p));
                        }
                        joined[rank as usize] = Some(s);
                        count += 1;
                    }
                    Err(e) => {
                        let msg = format!("malformed hello from {peer}: {e}");
                        let _ = write_answer(&mut s, Err(&msg));
                        return Err(err(msg));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = (1..env.world_size)
                        .filter(|&r| joined[r].is_none())
                        .collect();
                    return Err(err(format!(
                        "rank 0 waited {timeout:?} on {addr}; ranks {missing:?} never arrived"
                    )));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(err(format!("accept on {addr}: {e}"))),
        }
    }
    for s in joined.iter_mut().flatten() {
        write_answer(s, Ok(&id)).map_err(|e| err(format!("sending the id: {e}")))?;
    }
    Ok(())
}

fn join(env: &JobEnv, timeout: Duration) -> Result<[u8; ID_BYTES]> {
    let addr = env.master()?;
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(s) => break s,
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(err(format!(
                        "rank {} could not reach rank 0 at {addr} within {timeout:?}: {e}",
                        env.rank
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    s.set_read_timeout(Some(remaining)).ok();
    let mut hello = Vec::with_capacity(24);
    hello.extend_from_slice(HELLO);
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.extend_from_slice(&(env.rank as u64).to_le_bytes());
    hello.extend_from_slice(&(env.world_size as u64).to_le_bytes());
    s.write_all(&hello)
        .map_err(|e| err(format!("rank {} sending hello: {e}", env.rank)))?;
    read_answer(&mut s).map_err(|e| err(format!("rank {}: {e}", env.rank)))
}

fn read_hello(s: &mut TcpStream) -> std::result::Result<(u64, u64), String> {
    let mut buf = [0u8; 24];
    s.read_exact(&mut buf)
        .map_err(|e| format!("short or slow hello: {e}"))?;
    if &buf[0..4] != HELLO {
        return Err(format!("bad magic {:?}", &buf[0..4]));
    }
    let version = u32::from_le_bytes(buf[4..8].try_into().unwrap_or_default());
    if version != VERSION {
        return Err(format!("protocol version {version}, expected {VERSION}"));
    }
    let rank = u64::from_le_bytes(buf[8..16].try_into().unwrap_or_default());
    let world = u64::from_le_bytes(buf[16..24].try_into().unwrap_or_default());
    Ok((rank, world))
}

fn write_answer(
    s: &mut TcpStream,
    answer: std::result::Result<&[u8; ID_BYTES], &str>,
) -> std::io::Result<()> {
    let mut out = Vec::new();
    out.extend_from_slice(ANSWER);
    match answer {
        Ok(id) => {
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(id);
        }
        Err(msg) => {
            out.extend_from_slice(&1u32.to_le_bytes());
            out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
            out.extend_from_slice(msg.as_bytes());
        }
    }
    s.write_all(&out)
}

fn read_answer(s: &mut TcpStream) -> std::result::Result<[u8; ID_BYTES], String> {
    let mut head = [0u8; 8];
    s.read_exact(&mut head)
        .map_err(|e| format!("no answer from rank 0: {e}"))?;
    if &head[0..4] != ANSWER {
        return Err(format!(
            "malformed answer from rank 0 (magic {:?})",
            &head[0..4]
        ));
    }
    let status = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
    if status != 0 {
        let mut len = [0u8; 4];
        s.read_exact(&mut len)
            .map_err(|e| format!("truncated error from rank 0: {e}"))?;
        let len = u32::from_le_bytes(len).min(1 << 16) as usize;
        let mut msg = vec![0u8; len];
        s.read_exact(&mut msg)
            .map_err(|e| format!("truncated error from rank 0: {e}"))?;
        return Err(format!("rank 0 refused: {}", String::from_utf8_lossy(&msg)));
    }
    let mut id = [0u8; ID_BYTES];
    s.read_exact(&mut id)
        .map_err(|e| format!("truncated id from rank 0: {e}"))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> Result<JobEnv> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        JobEnv::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn bad_sizes_name_their_variable() {
        let base = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            env_of(&v).unwrap_err().to_string()
        };
        let e = with(&[("RANK", "0"), ("WORLD_SIZE", "0")]);
        assert!(e.contains("`WORLD_SIZE`"), "{e}");
        let e = with(&[("RANK", "2"), ("WORLD_SIZE", "2")]);
        assert!(e.contains("`RANK`"), "{e}");
    }

    #[test]
    fn environment_is_validated() {
        let ok = env_of(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(
            (ok.rank, ok.world_size, ok.local_rank, ok.master_port),
            (1, 4, 1, 29500)
        );
        let e = env_of(&[
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "x"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("RANK"), "{e}");
        let e = env_of(&[
            ("RANK", "4"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "x"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("WORLD_SIZE"), "{e}");
        let e = env_of(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "x"),
            ("MASTER_PORT", "70000"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("MASTER_PORT"), "{e}");
        let e = env_of(&[
            ("RANK", "x"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "x"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("non-negative integer"), "{e}");
    }
}
