//! The copy thread: payload copies of sends that need a fresh slot, off every caller's
//! thread, in the order they came. A copy that finds the quota used up waits for credit here
//! (within its send's deadline and the configured wait), then goes elsewhere or fails as the
//! node is configured.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};

use super::Transport;
use crate::sync::lock;

/// One copy to make.
pub(super) type Job = Box<dyn FnOnce(&Arc<Transport>) + Send>;

/// The queue of copies.
#[derive(Default)]
pub(super) struct Copier {
    queue: Mutex<Queue>,
    ready: Condvar,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
}

impl Copier {
    /// Queues `job`; `Err(job)` once the transport shut down.
    pub(super) fn push(&self, job: Job) -> Result<(), Job> {
        let mut queue = lock(&self.queue);
        if queue.closed {
            return Err(job);
        }
        queue.jobs.push_back(job);
        drop(queue);
        self.ready.notify_one();
        Ok(())
    }

    /// No more jobs; the thread ends once the queue is empty.
    pub(super) fn close(&self) {
        lock(&self.queue).closed = true;
        self.ready.notify_all();
    }
}

/// The copy thread's loop.
pub(super) fn run(t: &Arc<Transport>) {
    loop {
        let job = {
            let mut queue = lock(&t.copier.queue);
            loop {
                if let Some(job) = queue.jobs.pop_front() {
                    break Some(job);
                }
                if queue.closed {
                    break None;
                }
                queue = crate::sync::wait(&t.copier.ready, queue, None);
            }
        };
        match job {
            Some(job) => job(t),
            None => return,
        }
    }
}
