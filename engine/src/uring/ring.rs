//! One io_uring instance, owned by one core thread; the only place SQEs are pushed.

use std::io;
use std::time::Duration;

use io_uring::{EnterFlags, IoUring, Probe, cqueue, opcode, squeue, types};

/// Opcodes the engine needs; a kernel without one of them gets the fallback.
const REQUIRED: [(u8, &str); 8] = [
    (opcode::SendMsg::CODE, "SENDMSG"),
    (opcode::RecvMsg::CODE, "RECVMSG"),
    (opcode::Recv::CODE, "RECV"),
    (opcode::Read::CODE, "READ"),
    (opcode::Accept::CODE, "ACCEPT"),
    (opcode::Connect::CODE, "CONNECT"),
    (opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
    (opcode::PollAdd::CODE, "POLL_ADD"),
];

/// A ring plus what setup found out.
pub(crate) struct Ring {
    ring: IoUring,
    /// `SENDMSG_ZC` is supported (Linux 6.1).
    pub(crate) send_zc: bool,
    /// Receives may wait for readiness before their first attempt
    /// (`IORING_RECVSEND_POLL_FIRST`, Linux 5.19). No probe reports it, so it is assumed where
    /// Linux 6.1's `SENDMSG_ZC` is.
    pub(crate) recv_poll_first: bool,
    /// Setup flags that were accepted, for logs and stats.
    pub(crate) flags: &'static str,
}

impl Ring {
    /// Creates a ring with `SINGLE_ISSUER | DEFER_TASKRUN | COOP_TASKRUN | TASKRUN_FLAG`, retrying
    /// with `COOP_TASKRUN | TASKRUN_FLAG` and then none on `EINVAL` (older kernels), and checks
    /// the required opcodes.
    ///
    /// Must run on the thread that will use the ring (DEFER_TASKRUN requires it).
    pub(crate) fn new(entries: u32) -> io::Result<Self> {
        let cq = entries.saturating_mul(4);
        let mut last = io::Error::from_raw_os_error(libc::EINVAL);
        for flags in [
            "single_issuer|defer_taskrun|coop_taskrun|taskrun_flag",
            "coop_taskrun|taskrun_flag",
            "none",
        ] {
            let mut builder = IoUring::builder();
            builder.setup_cqsize(cq).dontfork();
            match flags {
                "none" => {}
                "coop_taskrun|taskrun_flag" => {
                    // The flag too: a busy-polling core learns from it that deferred work
                    // waits (`has_deferred_work`); without it, it would spin past it.
                    builder.setup_coop_taskrun().setup_taskrun_flag();
                }
                _ => {
                    builder
                        .setup_single_issuer()
                        .setup_defer_taskrun()
                        .setup_coop_taskrun()
                        .setup_taskrun_flag();
                }
            }
            match builder.build(entries) {
                Ok(ring) => {
                    let mut ring = Self {
                        ring,
                        send_zc: false,
                        recv_poll_first: false,
                        flags,
                    };
                    ring.send_zc = ring.check_features()?;
                    ring.recv_poll_first = ring.send_zc;
                    return Ok(ring);
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Checks what the engine needs; returns whether `SENDMSG_ZC` is there too.
    fn check_features(&self) -> io::Result<bool> {
        let params = self.ring.params();
        if !params.is_feature_nodrop()
            || !params.is_feature_ext_arg()
            || !params.is_feature_fast_poll()
        {
            return Err(io::Error::other(
                "kernel lacks IORING_FEAT_NODROP, EXT_ARG or FAST_POLL (needs Linux 5.11 or newer)",
            ));
        }
        let mut probe = Probe::new();
        self.ring.submitter().register_probe(&mut probe)?;
        for (code, name) in REQUIRED {
            if !probe.is_supported(code) {
                return Err(io::Error::other(format!(
                    "kernel does not support IORING_OP_{name}"
                )));
            }
        }
        Ok(probe.is_supported(opcode::SendMsgZc::CODE))
    }

    /// Queues one entry, submitting first if the submission queue is full.
    ///
    /// # Safety
    ///
    /// Every buffer, `msghdr`, `iovec` array, address and descriptor the entry points to must
    /// stay valid (and not move) until the entry's last completion has been reaped.
    pub(crate) unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: forwarded from this function's contract.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    /// Submits everything queued and waits until at least one completion arrives or `timeout`
    /// passes. Interruptions and timeouts are not errors.
    pub(crate) fn submit_and_wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let result = match timeout {
            Some(timeout) => {
                let ts = types::Timespec::from(timeout);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
            None => self.ring.submitter().submit_and_wait(1),
        };
        match result {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Submits everything queued and runs the work the kernel deferred to this thread (a receive
    /// whose bytes arrived completes here), without waiting and without arming a timer: an
    /// `io_uring_enter` with `GETEVENTS` and no minimum. (A wait with a zero timeout instead
    /// arms an already-expired timer each time, which costs a timer interrupt.)
    pub(crate) fn submit_and_run(&mut self) -> io::Result<()> {
        let to_submit = u32::try_from(self.ring.submission().len()).unwrap_or(u32::MAX);
        // SAFETY: no argument is passed; the queued entries' memory stays valid until their
        // completions, as `push` requires of its callers.
        let result = unsafe {
            self.ring.submitter().enter::<libc::sigset_t>(
                to_submit,
                0,
                EnterFlags::GETEVENTS.bits(),
                None,
            )
        };
        match result {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether the kernel has work deferred to this thread (`IORING_SQ_TASKRUN`): bytes arrived
    /// for a receive, a send can go on. [`Ring::submit_and_run`] runs it.
    pub(crate) fn has_deferred_work(&mut self) -> bool {
        self.ring.submission().taskrun()
    }

    /// Whether completions are waiting to be drained.
    pub(crate) fn has_completions(&mut self) -> bool {
        let mut cq = self.ring.completion();
        cq.sync();
        !cq.is_empty()
    }

    /// Takes every available completion as `(user_data, result, flags)`.
    pub(crate) fn drain(&mut self, out: &mut std::collections::VecDeque<(u64, i32, u32)>) {
        let mut cq = self.ring.completion();
        cq.sync();
        out.extend(cq.map(|cqe: cqueue::Entry| (cqe.user_data(), cqe.result(), cqe.flags())));
    }
}

/// Whether a ring can be created in this process at all, and why not.
pub(crate) fn availability() -> Result<&'static str, String> {
    if std::env::var_os("TENSORWIRE_FORCE_FALLBACK").is_some_and(|v| v != "0" && !v.is_empty()) {
        return Err("TENSORWIRE_FORCE_FALLBACK is set".to_owned());
    }
    // Probe on a throwaway thread so no user thread ever holds io_uring task state.
    let probe = std::thread::Builder::new()
        .name("tensorwire-probe".into())
        .spawn(|| Ring::new(8).map(|ring| ring.flags))
        .map_err(|e| format!("cannot start the io_uring probe thread: {e}"))?;
    let result = probe
        .join()
        .map_err(|_| "the io_uring probe thread panicked".to_owned())?;
    match result {
        Ok(flags) => Ok(flags),
        Err(e) => Err(match e.raw_os_error() {
            Some(libc::ENOSYS) => "io_uring_setup: ENOSYS (kernel without io_uring)".to_owned(),
            Some(libc::EPERM) => {
                "io_uring_setup: EPERM (blocked by seccomp or kernel.io_uring_disabled)".to_owned()
            }
            _ => format!("io_uring setup failed: {e}"),
        }),
    }
}
