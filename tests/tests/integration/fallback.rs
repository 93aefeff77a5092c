//! Where io_uring cannot be used: the node runs the tokio fallback (or says how to plug one),
//! forced or for real under a seccomp filter that makes `io_uring_setup` fail.

use std::process::Command;
use std::sync::Arc;

use tensorwire_engine::{Error, Node, Reply};
use tensorwire_tests::*;

#[test]
fn a_forced_fallback_without_a_fallback_plugged_in_says_how_to_plug_one() {
    let _serial = serial();
    let err = Node::builder(any_local_address())
        .force_fallback(true)
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::DriverUnavailable { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("forced"), "{text}");
    assert!(text.contains("NodeBuilder::fallback"), "{text}");
}

#[test]
fn a_forced_fallback_runs_the_tokio_driver_and_says_why() {
    let _serial = serial();
    let node = Driver::Tokio.builder().build().unwrap();
    let stats = node.stats();
    assert_eq!(stats.driver, "tokio");
    assert!(stats.fallback_reason.is_some());
    assert!(
        tensorwire_engine::stats::snapshot()
            .drivers
            .contains(&(node.local_addr(), "tokio"))
    );
}

#[test]
fn io_uring_blocked_by_seccomp_falls_back_to_tokio() {
    let _serial = serial();
    let exe = std::env::current_exe().unwrap();
    let output = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            "fallback::seccomp_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TENSORWIRE_SECCOMP_CHILD", "1")
        .output()
        .expect("the child test runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed"),
        "the child ran its test:\n{stdout}"
    );
    assert!(
        stdout.contains("fallback reason: io_uring_setup: EPERM"),
        "{stdout}"
    );
}

/// Runs in a child process only (see above): blocks `io_uring_setup` with seccomp, then
/// builds nodes with the fallback plugged in and moves messages between them.
#[test]
#[ignore = "run by io_uring_blocked_by_seccomp_falls_back_to_tokio in a child process"]
fn seccomp_child() {
    assert_eq!(
        std::env::var("TENSORWIRE_SECCOMP_CHILD").as_deref(),
        Ok("1"),
        "only meant to run in the child process"
    );
    install_io_uring_seccomp_filter();
    let reason = tensorwire_engine::io_uring_available().unwrap_err();
    println!("fallback reason: {reason}");
    let fallback = || Arc::new(tensorwire_compat::TokioFallback::default());
    let server = Node::builder(any_local_address())
        .fallback(fallback())
        .build()
        .unwrap();
    server
        .serve_on_core("echo", |r| Ok(Reply::Tensor(r.message)))
        .unwrap();
    let client = Node::builder(any_local_address())
        .fallback(fallback())
        .in_process_delivery(false)
        .shared_memory(false)
        .build()
        .unwrap();
    assert_eq!(
        (server.stats().driver, client.stats().driver),
        ("tokio", "tokio")
    );
    let message = patterned(4, 3, 1 << 20);
    let reply = client
        .ask(server.local_addr(), "echo", message.clone(), TIMEOUT)
        .wait();
    assert_eq!(tensor(reply.unwrap()), message);
    let reply = client.ask_blocking(server.local_addr(), "echo", message.clone(), TIMEOUT);
    assert_eq!(tensor(reply.unwrap()), message);
}

/// Makes `io_uring_setup` fail with `EPERM` for this process and its children, as a container
/// runtime's default seccomp profile does.
fn install_io_uring_seccomp_filter() {
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u16, k: u32, jt: u8, jf: u8| libc::sock_filter { code, jt, jf, k };
    let code = |bits: u32| u16::try_from(bits).unwrap();
    let (ld, jeq, ret) = (
        code(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS),
        code(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K),
        code(libc::BPF_RET | libc::BPF_K),
    );
    let io_uring_setup = u32::try_from(libc::SYS_io_uring_setup).unwrap();
    let eperm = u32::try_from(libc::EPERM).unwrap();
    let mut program = [
        stmt(ld, 4), // seccomp_data.arch
        jump(jeq, AUDIT_ARCH_X86_64, 1, 0),
        stmt(ret, SECCOMP_RET_ALLOW),
        stmt(ld, 0), // seccomp_data.nr
        jump(jeq, io_uring_setup, 0, 1),
        stmt(ret, SECCOMP_RET_ERRNO | eperm),
        stmt(ret, SECCOMP_RET_ALLOW),
    ];
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len()).unwrap(),
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `fprog` points to a valid filter program for the duration of the calls; these
    // calls change only this process's own syscall filter.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &raw const fprog
            ),
            0,
            "installing the seccomp filter: {}",
            std::io::Error::last_os_error()
        );
    }
}
