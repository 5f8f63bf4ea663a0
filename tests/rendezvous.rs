//! The torchrun-style rendezvous with real processes on 127.0.0.1: this test
//! binary re-runs itself as each rank (`rank_process`, active only when
//! FTN_RDZV_CHILD is set). Covers the shared id and each failure: a wrong
//! world size, a busy port, a peer that never arrives, a malformed message.

use std::io::Write as _;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ferrotron::comm::rendezvous::{share_id, JobEnv, ID_BYTES};

/// The body of one rank process: prints `RESULT ok <hex id>` or `RESULT err <message>`.
#[test]
#[ignore = "entry point of the rank processes the other tests spawn"]
fn rank_process() {
    if std::env::var("FTN_RDZV_CHILD").is_err() {
        return;
    }
    let timeout = Duration::from_millis(
        std::env::var("FTN_RDZV_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000),
    );
    let outcome = JobEnv::from_env().and_then(|env| {
        let id = (env.rank == 0).then(|| {
            let mut id = [0u8; ID_BYTES];
            for (i, b) in id.iter_mut().enumerate() {
                *b = (i as u8)
                    .wrapping_mul(37)
                    .wrapping_add(std::process::id() as u8);
            }
            id
        });
        share_id(&env, id, timeout)
    });
    let line = match outcome {
        Ok(id) => format!(
            "RESULT ok {}",
            id.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
        Err(e) => format!("RESULT err {e}"),
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn spawn_rank(rank: usize, world: usize, port: u16, timeout_ms: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "rank_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FTN_RDZV_CHILD", "1")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("FTN_RDZV_TIMEOUT_MS", timeout_ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning a rank process")
}

fn result_of(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.find("RESULT ").map(|i| l[i + 7..].to_string()))
        .unwrap_or_else(|| format!("no result line in: {text}"))
}

#[test]
fn four_processes_share_rank_zeros_id() {
    let port = free_port();
    let children: Vec<Child> = (0..4).map(|r| spawn_rank(r, 4, port, 20_000)).collect();
    let results: Vec<String> = children.into_iter().map(result_of).collect();
    assert!(results[0].starts_with("ok "), "{results:?}");
    assert_eq!(results[0].len(), 3 + 2 * ID_BYTES);
    for r in &results {
        assert_eq!(
            r, &results[0],
            "all ranks must hold rank 0's id: {results:?}"
        );
    }
}

#[test]
fn a_wrong_world_size_is_refused_on_both_sides() {
    let port = free_port();
    let r0 = spawn_rank(0, 2, port, 10_000);
    let r1 = spawn_rank(1, 3, port, 10_000);
    let (a, b) = (result_of(r0), result_of(r1));
    assert!(a.starts_with("err") && a.contains("WORLD_SIZE=3"), "{a}");
    assert!(
        b.starts_with("err") && b.contains("refused") && b.contains("WORLD_SIZE=3"),
        "{b}"
    );
}

#[test]
fn a_busy_port_is_a_clear_error() {
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let r = result_of(spawn_rank(0, 2, port, 2_000));
    assert!(r.starts_with("err") && r.contains("busy"), "{r}");
    drop(busy);
}

#[test]
fn a_peer_that_never_arrives_times_out_with_its_rank() {
    let port = free_port();
    let r0 = spawn_rank(0, 3, port, 1_500);
    let r1 = spawn_rank(1, 3, port, 1_500);
    let (a, b) = (result_of(r0), result_of(r1));
    assert!(
        a.starts_with("err") && a.contains("[2] never arrived"),
        "{a}"
    );
    assert!(b.starts_with("err"), "{b}");
    // And a rank whose rank 0 never comes up gives up too.
    let lone = result_of(spawn_rank(1, 2, free_port(), 500));
    assert!(
        lone.starts_with("err") && lone.contains("could not reach rank 0"),
        "{lone}"
    );
}

#[test]
fn a_malformed_message_is_rejected() {
    let port = free_port();
    let r0 = spawn_rank(0, 2, port, 10_000);
    let mut s = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let a = result_of(r0);
    assert!(
        a.starts_with("err") && a.contains("malformed hello") && a.contains("bad magic"),
        "{a}"
    );
}
