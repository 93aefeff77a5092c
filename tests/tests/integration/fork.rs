//! A process that made a node forks: in the child, the inherited node fails every call at
//! once (never hangs), and the child makes a node of its own that works — in-process, to the
//! parent over PTR1, and with its deadlines honoured.
//!
//! The forking runs in a child process of this test binary that runs one test on one thread,
//! so no other test holds a lock at the moment of the fork.

use std::process::Command;
use std::time::{Duration, Instant};

use tensorwire_engine::shm::not_inherited;
use tensorwire_engine::{Error, Node, Reply};
use tensorwire_tests::*;

#[test]
fn a_child_made_by_fork_cannot_use_its_parents_node_and_makes_its_own() {
    let stdout = run_alone("fork::forking_child");
    assert_eq!(stdout.matches("forked child passed").count(), 2, "{stdout}");
}

#[test]
fn a_child_made_by_fork_never_maps_anything_where_its_parents_shared_memory_was() {
    let stdout = run_alone("fork::forking_shm_child");
    assert!(stdout.contains("forked child passed"), "{stdout}");
}

/// Runs the ignored test `name` of this binary in a process of its own, on one thread;
/// returns its output once it passed.
fn run_alone(name: &str) -> String {
    let _serial = serial();
    let exe = std::env::current_exe().unwrap();
    let output = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            name,
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TENSORWIRE_FORK_CHILD", "1")
        .output()
        .expect("the forking test runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "it failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "it ran:\n{stdout}");
    stdout
}

/// Runs in a process of its own (see above): a view of a peer's segment, received over shared
/// memory, is inherited by a child as an object only — its range is reserved there, so a stale
/// pointer faults instead of reading whatever the child maps next, and dropping it in the
/// child unmaps nothing and touches nothing of the parent's.
#[test]
#[ignore = "run by a_child_made_by_fork_never_maps_anything_where_its_parents_shared_memory_was"]
fn forking_shm_child() {
    assert_eq!(
        std::env::var("TENSORWIRE_FORK_CHILD").as_deref(),
        Ok("1"),
        "only meant to run in its own process"
    );
    let shm = || shm_builder().build().unwrap();
    let (server, client) = (shm(), shm());
    // A reply made by the server travels in the server's segment: the client holds a view of
    // a peer's memory, with its lease and its mapping's count (an echo would come back in the
    // client's own slot).
    server
        .serve("fresh", 1, |_| Ok(Reply::Tensor(patterned(3, 1, 1 << 20))))
        .unwrap();
    let sent = patterned(3, 1, 1 << 20);
    let reply = client
        .ask(server.local_addr(), "fresh", patterned(0, 0, 0), TIMEOUT)
        .wait()
        .unwrap();
    let view = tensor(reply).buffers[0].clone();
    assert!(!not_inherited::inherited(view.as_ptr()));
    let page = page_of(view.as_ptr());
    // SAFETY: the child only runs this test's code and leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let passed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert!(
                not_inherited::inherited(view.as_ptr()),
                "listed as the parent's"
            );
            assert!(reserved(page), "reserved in the child");
            drop(view);
            assert!(
                reserved(page),
                "still reserved once the child dropped its view"
            );
            // The child's own shared memory works, elsewhere.
            let (server, client) = (shm(), shm());
            server
                .serve("fresh", 1, |_| Ok(Reply::Tensor(patterned(4, 1, 1 << 20))))
                .unwrap();
            let reply = client
                .ask(server.local_addr(), "fresh", patterned(0, 0, 0), TIMEOUT)
                .wait()
                .expect("the child's own nodes talk over shared memory");
            let own = tensor(reply).buffers[0].clone();
            assert!(!not_inherited::inherited(own.as_ptr()));
            assert_eq!(own, patterned(4, 1, 1 << 20).buffers[0]);
        }));
        if passed.is_ok() {
            println!("forked child passed");
        }
        // SAFETY: leaves the forked child without running the parent's destructors.
        unsafe { libc::_exit(i32::from(passed.is_err())) };
    }
    assert_eq!(
        wait_for(pid, Duration::from_secs(60)),
        0,
        "the child failed"
    );
    assert_eq!(view, sent.buffers[0], "the parent's view is untouched");
}

/// The page `at` lies in.
fn page_of(at: *const u8) -> usize {
    at as usize & !4095
}

/// Whether something is mapped at `page` (a mapping there without replacing would fail).
fn reserved(page: usize) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; a new one made here is
    // unmapped at once.
    unsafe {
        let got = libc::mmap(
            page as *mut libc::c_void,
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
        if got == libc::MAP_FAILED {
            return std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST);
        }
        libc::munmap(got, 4096);
        false
    }
}

/// Runs in a process of its own (see above).
#[test]
#[ignore = "run by a_child_made_by_fork_cannot_use_its_parents_node_and_makes_its_own"]
fn forking_child() {
    assert_eq!(
        std::env::var("TENSORWIRE_FORK_CHILD").as_deref(),
        Ok("1"),
        "only meant to run in its own process"
    );
    for driver in [Driver::Uring, Driver::Tokio] {
        let node = driver.builder().build().unwrap();
        node.serve("echo", 1, |request| Ok(Reply::Tensor(request.message)))
            .unwrap();
        let endpoint = node.endpoint("mailbox").unwrap();
        // Threads, timers and connections exist before the fork.
        node.ask(node.local_addr(), "echo", patterned(1, 1, 64), TIMEOUT)
            .wait()
            .unwrap();
        // SAFETY: the child only runs this test's code and leaves with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let passed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                in_the_child(driver, &node, &endpoint);
            }));
            if passed.is_ok() {
                println!("forked child passed ({driver:?})");
            }
            // SAFETY: leaves the forked child without running the parent's destructors.
            unsafe { libc::_exit(i32::from(passed.is_err())) };
        }
        assert_eq!(
            wait_for(pid, Duration::from_secs(60)),
            0,
            "{driver:?}: the child failed"
        );
        // The parent's node is untouched.
        node.ask(node.local_addr(), "echo", patterned(1, 1, 64), TIMEOUT)
            .wait()
            .expect("the parent's node still works");
        node.close(Duration::from_secs(5));
    }
}

fn in_the_child(driver: Driver, inherited: &Node, endpoint: &tensorwire_engine::Endpoint) {
    let started = Instant::now();
    let forked = |result: Result<(), Error>, what: &str| match result {
        Err(Error::Forked { owner, current }) => {
            assert_ne!(owner, current, "{what}");
            assert_eq!(current, std::process::id(), "{what}");
        }
        other => panic!("{what}: {other:?}"),
    };
    let to = inherited.local_addr();
    let msg = || patterned(1, 1, 64);
    forked(
        inherited
            .ask(to, "echo", msg(), Duration::from_secs(3))
            .wait()
            .map(drop),
        "ask",
    );
    forked(
        inherited
            .tell(to, "echo", msg(), Duration::from_secs(3))
            .wait(),
        "tell",
    );
    forked(
        inherited
            .ask_blocking(to, "echo", msg(), Duration::from_secs(3))
            .map(drop),
        "blocking ask",
    );
    forked(endpoint.recv_blocking(None).map(drop), "receive");
    forked(inherited.endpoint("more").map(drop), "endpoint");
    forked(
        inherited
            .destination(to, "echo", tensorwire_engine::Via::Preferred)
            .map(drop),
        "ref",
    );
    forked(inherited.check_process(), "check");
    inherited.close(Duration::from_secs(3));
    inherited.shutdown();
    drop(inherited.clone()); // leaked, not shut down
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "every call failed at once ({:?})",
        started.elapsed()
    );

    let own = driver
        .builder()
        .build()
        .expect("the child makes its own node");
    own.serve("echo", 1, |request| Ok(Reply::Tensor(request.message)))
        .unwrap();
    let _never = own.endpoint("never").unwrap();
    let reply = own
        .ask(own.local_addr(), "echo", patterned(1, 2, 4096), TIMEOUT)
        .wait()
        .expect("in-process ask in the child");
    assert_eq!(checksum(&tensor(reply)), checksum(&patterned(1, 2, 4096)));
    let reply = own
        .ask(to, "echo", patterned(1, 1, 1 << 20), TIMEOUT)
        .wait()
        .expect("the child reaches its parent's node over PTR1");
    assert_eq!(
        checksum(&tensor(reply)),
        checksum(&patterned(1, 1, 1 << 20))
    );
    let err = own
        .ask(own.local_addr(), "never", msg(), Duration::from_millis(200))
        .wait()
        .expect_err("nobody answers");
    assert!(err.is_timeout(), "the child's deadlines fire: {err}");
    own.close(Duration::from_secs(5));
}

/// The child's exit code; kills it and panics if it has not exited within `limit`.
fn wait_for(pid: libc::pid_t, limit: Duration) -> i32 {
    let started = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let res = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if res == pid {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                -1
            };
        }
        if started.elapsed() > limit {
            // SAFETY: killing our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the forked child hung for {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
