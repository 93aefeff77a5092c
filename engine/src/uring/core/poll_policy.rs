//! When a core busy-polls before it sleeps, and for how long: a pure policy, fed the core's
//! idle spells and the driver's active connections, so the decision is tested without a ring.
//!
//! A core polls for as long as the budget allows only while it carries the only active
//! connection of the whole driver (one that moved bytes within the last [`ACTIVE_WINDOW`];
//! idle pooled connections do not count; with more, some thread of this process has work,
//! and a long poll would take its CPU: see the last paragraph) and its recent idle spells
//! were at most twice the budget (a quick request-reply conversation,
//! whose next message comes sooner than a sleeping thread wakes up). A poll lasts at most
//! twice the longest recent idle spell, within the budget, and after a poll that found
//! nothing the core sleeps through the next idle spells: one after a first miss, twice as many
//! after each further miss in a row, at most [`BACKOFF`] (its producer may share its CPU);
//! a poll that finds work ends the backoff. One late message (a caller descheduled, a page
//! fault) so costs one wake-up, not 32: with a fixed backoff of 32 spells, 1 MiB one-way
//! asks slept through 47 % of their waits (292 misses in 5,000 asks) and moved 2.7 GB/s
//! instead of 3.7.
//!
//! While the driver carries several active connections and this core at least one of them,
//! the core polls briefly instead ([`SHARED_POLL`], within the budget; these polls neither
//! back off nor end a backoff of the lone conversation's): long enough to catch the next
//! completion of a busy exchange without a wake-up, short enough to leave the CPU to the
//! process's other threads (the poll yields to them). Sleeping at once there cost 5.6–6.0
//! context switches per 1 MiB ask with 64 in flight (the tokio driver: 1.2–1.3).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A connection that moved bytes within this long counts as active.
pub(super) const ACTIVE_WINDOW: Duration = Duration::from_millis(10);

/// How long a core polls before it sleeps while other connections of the driver are active
/// too. Measured against sleeping at once (`scripts/builds-ab 7 0.5`, fresh pairs, medians):
/// 1 MiB asks 64 in flight 5,006 → 6,461 asks/s, 1 in flight 3,480 → 3,748; 4 KiB asks one
/// at a time through the asynchronous client (its two cores take turns) 20,358 → 27,024;
/// 64 in flight 4 KiB unchanged (126,773 → 126,735). At 50 µs the last lost 7 %.
pub(super) const SHARED_POLL: Duration = Duration::from_micros(20);

/// The most idle spells a core sleeps through without polling, after polls that found
/// nothing.
pub(super) const BACKOFF: u32 = 32;

/// Budgets beyond which an idle spell counts as simply long (see [`PollPolicy::idle_spell`]):
/// twice the longest spell after which a core still polls, so one long spell keeps it from
/// polling for a few spells (6), not for dozens.
const LONG_SPELL: u32 = 4;

/// One core's busy-poll state.
#[derive(Debug)]
pub(super) struct PollPolicy {
    budget: Duration,
    /// Idle spells to sleep through without polling, after a poll that found nothing.
    skips: u32,
    /// Polls in a row that found nothing.
    misses: u32,
    /// The longest recent idle spell (busy-polling or asleep; at most [`LONG_SPELL`] budgets),
    /// forgetting an eighth per spell.
    idle_estimate: Duration,
    /// The last poll granted was a short one among several active connections: what it
    /// finds or misses does not touch the lone conversation's backoff.
    shared: bool,
}

impl PollPolicy {
    /// A core that has not been idle yet: it counts as long idle, so it sleeps first.
    pub(super) fn new(budget: Duration) -> Self {
        Self {
            budget,
            skips: 0,
            misses: 0,
            idle_estimate: budget.saturating_mul(LONG_SPELL),
            shared: false,
        }
    }

    /// How long to poll before sleeping now, or `None` to sleep at once, for a core carrying
    /// `own` of the `driver`'s active connections.
    pub(super) fn poll_for(&mut self, own: usize, driver: usize) -> Option<Duration> {
        self.shared = own >= 1 && driver >= 2;
        if self.shared {
            return (!self.budget.is_zero()).then(|| self.budget.min(SHARED_POLL));
        }
        if own != 1 || !worth_polling(self.budget, driver, self.idle_estimate) {
            return None;
        }
        if self.skips > 0 {
            self.skips -= 1;
            return None;
        }
        Some(self.budget.min(self.idle_estimate.saturating_mul(2)))
    }

    /// A poll found nothing: sleep through the next idle spells, twice as many as after the
    /// previous miss in a row (1, 2, 4, …, at most [`BACKOFF`]).
    pub(super) fn missed(&mut self) {
        if self.shared {
            return;
        }
        self.skips = 1u32
            .checked_shl(self.misses)
            .unwrap_or(BACKOFF)
            .min(BACKOFF);
        self.misses = self.misses.saturating_add(1);
    }

    /// A poll found work: the next miss backs off from one spell again.
    pub(super) fn found(&mut self) {
        if self.shared {
            return;
        }
        self.misses = 0;
    }

    /// The core was idle (polling or asleep) for `spell`. A spell counts as at most
    /// [`LONG_SPELL`] budgets: any longer one only says "too long to poll", and remembering
    /// it whole kept a core from polling for dozens of spells after a pause (by the decay's
    /// arithmetic, 57 spells after a 1 s pause at the default budget and 25 at a 20 ms one;
    /// measured, a fixture told to poll 20 ms polled 0.74 of the time through rounds of asks
    /// 10 ms apart that each came after 1.5 s of silence, 0.93 with the cap:
    /// `scripts/poll-after-pause`).
    pub(super) fn idle_spell(&mut self, spell: Duration) {
        let spell = spell.min(self.budget.saturating_mul(LONG_SPELL));
        self.idle_estimate = spell.max(self.idle_estimate - self.idle_estimate / 8);
    }
}

/// The two connections of a core that moved bytes last, and when: enough to tell none, one or
/// several active connections apart in constant time, however many sit idle.
#[derive(Debug)]
pub(super) struct RecentConns<K> {
    /// Most recent first; distinct keys.
    last: [Option<(K, Instant)>; 2],
}

impl<K: Copy + PartialEq> RecentConns<K> {
    pub(super) fn new() -> Self {
        Self { last: [None, None] }
    }

    /// Connection `key` moved bytes at `now`.
    pub(super) fn note(&mut self, key: K, now: Instant) {
        match self.last[0] {
            Some((first, _)) if first == key => {}
            _ => self.last[1] = self.last[0],
        }
        self.last[0] = Some((key, now));
    }

    /// When the two connections moved bytes last, as [`stamp`]s (0: none), for other cores.
    pub(super) fn stamps(&self) -> [u64; 2] {
        self.last.map(|entry| entry.map_or(0, |(_, at)| stamp(at)))
    }
}

/// How many of the connections behind `stamps` moved bytes within [`ACTIVE_WINDOW`] before
/// `now`: 0, 1, or 2 for "more than one".
pub(super) fn active(stamps: [u64; 2], now: Instant) -> usize {
    let now = stamp(now);
    let window = u64::try_from(ACTIVE_WINDOW.as_nanos()).unwrap_or(u64::MAX);
    stamps
        .iter()
        .filter(|&&at| at != 0 && now.saturating_sub(at) < window)
        .count()
}

/// `at` in nanoseconds since the process's first stamp, plus one (0 means "never"): an
/// instant other threads can read from an atomic.
pub(super) fn stamp(at: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| at.checked_sub(Duration::from_secs(1)).unwrap_or(at));
    u64::try_from(at.saturating_duration_since(epoch).as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// Whether a core of a driver carrying `connections` connections, whose recent idle spells
/// lasted up to `idle`, polls before it sleeps.
fn worth_polling(budget: Duration, connections: usize, idle: Duration) -> bool {
    !budget.is_zero() && connections == 1 && idle <= budget.saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_micros(250);

    /// A policy whose recent idle spells all lasted `spell`.
    fn settled(spell: Duration) -> PollPolicy {
        let mut policy = PollPolicy::new(BUDGET);
        for _ in 0..200 {
            policy.idle_spell(spell);
        }
        policy
    }

    #[test]
    fn a_lone_connection_is_polled_after_short_idle_spells_only() {
        let short = Duration::from_micros(30);
        assert!(worth_polling(BUDGET, 1, short));
        assert!(worth_polling(BUDGET, 1, BUDGET * 2));
        assert!(!worth_polling(
            BUDGET,
            1,
            BUDGET * 2 + Duration::from_nanos(1)
        ));
        assert!(!worth_polling(BUDGET, 0, short));
        assert!(
            !worth_polling(BUDGET, 2, short),
            "64 asks in flight: the CPU goes to others"
        );
        assert!(
            !worth_polling(Duration::ZERO, 1, Duration::ZERO),
            "turned off"
        );
        assert!(
            worth_polling(Duration::MAX, 1, Duration::MAX),
            "no overflow"
        );
    }

    #[test]
    fn a_new_core_sleeps_first_and_polls_once_its_spells_are_short() {
        let mut policy = PollPolicy::new(BUDGET);
        assert_eq!(policy.poll_for(1, 1), None, "a core that just started");
        policy = settled(Duration::from_micros(30));
        assert_eq!(
            policy.poll_for(1, 1),
            Some(Duration::from_micros(60)),
            "twice the longest recent spell, within the budget"
        );
        policy = settled(Duration::from_micros(200));
        assert_eq!(policy.poll_for(1, 1), Some(BUDGET));
        assert_eq!(
            policy.poll_for(1, 2),
            Some(SHARED_POLL),
            "another core has work: a short poll"
        );
        assert_eq!(policy.poll_for(0, 1), None, "the connection is elsewhere");
    }

    #[test]
    fn one_long_spell_is_remembered_and_then_forgotten() {
        let mut policy = settled(Duration::from_micros(30));
        policy.idle_spell(Duration::from_millis(10));
        assert_eq!(policy.poll_for(1, 1), None, "a long spell just happened");
        let mut spells = 0;
        while policy.poll_for(1, 1).is_none() {
            policy.idle_spell(Duration::from_micros(30));
            spells += 1;
            assert!(spells < 100, "the long spell is never forgotten");
        }
        assert!(spells > 3, "forgotten after {spells} spells: too fast");
        assert!(spells <= 6, "remembered for {spells} spells: too long");
    }

    #[test]
    fn after_a_pause_of_any_length_a_conversation_is_polled_again_within_six_spells() {
        for pause in [
            Duration::from_millis(1),
            Duration::from_secs(1),
            Duration::MAX,
        ] {
            let mut policy = settled(Duration::from_micros(30));
            policy.idle_spell(pause);
            let mut spells = 0;
            while policy.poll_for(1, 1).is_none() {
                policy.idle_spell(Duration::from_micros(30));
                spells += 1;
            }
            assert!(spells <= 6, "{spells} spells after a pause of {pause:?}");
        }
        let mut fresh = PollPolicy::new(BUDGET);
        assert_eq!(fresh.poll_for(1, 1), None, "a new core sleeps first");
        let mut spells = 0;
        while fresh.poll_for(1, 1).is_none() {
            fresh.idle_spell(Duration::from_micros(30));
            spells += 1;
        }
        assert!(spells <= 6, "a new core polls after {spells} spells");
    }

    #[test]
    fn idle_connections_do_not_count_as_active_and_two_busy_ones_do() {
        let t0 = Instant::now();
        let mut recent = RecentConns::new();
        assert_eq!(active(recent.stamps(), t0), 0);
        recent.note(1, t0);
        recent.note(1, t0 + Duration::from_micros(300));
        assert_eq!(
            active(recent.stamps(), t0 + Duration::from_millis(1)),
            1,
            "one conversation"
        );
        recent.note(2, t0 + Duration::from_millis(2));
        assert_eq!(active(recent.stamps(), t0 + Duration::from_millis(3)), 2);
        assert_eq!(
            active(recent.stamps(), t0 + Duration::from_millis(11)),
            1,
            "the first one went quiet"
        );
        recent.note(3, t0 + Duration::from_millis(12));
        recent.note(2, t0 + Duration::from_millis(12));
        assert_eq!(active(recent.stamps(), t0 + Duration::from_millis(13)), 2);
        assert_eq!(active(recent.stamps(), t0 + Duration::from_millis(30)), 0);
    }

    /// Misses `policy` in a row, each after the backoff of the one before; returns how many
    /// spells the last backoff lasted.
    fn miss_in_a_row(policy: &mut PollPolicy, misses: u32) -> u32 {
        let mut skipped = 0;
        for _ in 0..misses {
            assert!(policy.poll_for(1, 1).is_some(), "polls after its backoff");
            policy.missed();
            skipped = 0;
            while policy.poll_for(1, 1).is_none() {
                skipped += 1;
                assert!(skipped <= BACKOFF, "a backoff past {BACKOFF} spells");
            }
        }
        skipped
    }

    #[test]
    fn polls_that_find_nothing_back_off_twice_as_long_each_time_up_to_a_bound() {
        let mut policy = settled(Duration::from_micros(30));
        assert_eq!(
            miss_in_a_row(&mut policy, 1),
            1,
            "one late message: one spell"
        );
        assert_eq!(miss_in_a_row(&mut policy, 1), 2);
        assert_eq!(miss_in_a_row(&mut policy, 1), 4);
        assert_eq!(miss_in_a_row(&mut policy, 10), BACKOFF, "bounded");
    }

    #[test]
    fn a_poll_that_finds_work_ends_the_backoff() {
        let mut policy = settled(Duration::from_micros(30));
        assert_eq!(miss_in_a_row(&mut policy, 6), BACKOFF);
        assert!(policy.poll_for(1, 1).is_some());
        policy.found();
        assert_eq!(
            miss_in_a_row(&mut policy, 1),
            1,
            "backs off from one spell again"
        );
    }

    #[test]
    fn among_several_active_connections_a_core_polls_briefly_whatever_its_spells() {
        let mut fresh = PollPolicy::new(BUDGET);
        assert_eq!(
            fresh.poll_for(1, 2),
            Some(SHARED_POLL),
            "even before short spells"
        );
        assert_eq!(fresh.poll_for(2, 2), Some(SHARED_POLL), "two of its own");
        assert_eq!(fresh.poll_for(0, 2), None, "none of them on this core");
        let mut small = PollPolicy::new(Duration::from_micros(5));
        assert_eq!(
            small.poll_for(1, 2),
            Some(Duration::from_micros(5)),
            "within the budget"
        );
        let mut never = PollPolicy::new(Duration::ZERO);
        assert_eq!(never.poll_for(1, 2), None, "a zero budget never polls");
    }

    #[test]
    fn short_polls_among_several_leave_the_lone_conversation_s_backoff_alone() {
        let mut policy = settled(Duration::from_micros(30));
        for _ in 0..10 {
            assert_eq!(policy.poll_for(1, 2), Some(SHARED_POLL));
            policy.missed();
        }
        assert_eq!(
            policy.poll_for(1, 1),
            Some(Duration::from_micros(60)),
            "the lone conversation polls at once"
        );
        policy.missed();
        assert_eq!(policy.poll_for(1, 2), Some(SHARED_POLL));
        policy.found();
        assert_eq!(
            policy.poll_for(1, 1),
            None,
            "its own miss still backs off; a short poll that found work does not end that"
        );
        assert!(policy.poll_for(1, 1).is_some());
        policy.missed();
        assert_eq!(
            policy.poll_for(1, 1),
            None,
            "a second miss in a row: two spells"
        );
        assert_eq!(policy.poll_for(1, 1), None);
        assert!(policy.poll_for(1, 1).is_some());
    }
}
