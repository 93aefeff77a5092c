use std::time::{Duration, Instant};

use super::*;

const TTL: Duration = Duration::from_secs(10);

fn check<'a>(
    leases: &'a mut Leases<&'static str>,
    d: &Descriptor,
    now: Instant,
) -> Result<&'a &'static str, ShmError> {
    let mut freed = Vec::new();
    leases.check(d, now, &mut freed)
}

#[test]
fn an_offered_region_maps_while_its_lease_lives_and_goes_with_it() {
    let (mut sut, now) = (Leases::new(), Instant::now());
    let d = sut.offer("a", 100, TTL, now).unwrap();
    assert_eq!((d.offset, d.len), (0, 100));
    assert_eq!(check(&mut sut, &d, now), Ok(&"a"));
    let mut freed = Vec::new();
    assert!(sut.release(&d, &mut freed));
    assert_eq!(freed, vec!["a"], "the region is handed back");
    assert_eq!(check(&mut sut, &d, now), Err(ShmError::RegionGone));
    assert_eq!(sut.stats(), ShmStats::default());
}

#[test]
fn release_is_idempotent_and_ignores_forged_or_stale_descriptors() {
    let (mut sut, now) = (Leases::new(), Instant::now());
    sut.publish("model", "m", 10).unwrap();
    let a = sut.open("model", TTL, now).unwrap();
    let b = sut.open("model", TTL, now).unwrap();
    let mut freed = Vec::new();
    let forged = Descriptor {
        lease_id: a.lease_id,
        generation: a.generation + 1,
        ..a
    };
    assert!(!sut.release(&forged, &mut freed));
    let swapped = Descriptor {
        lease_id: b.lease_id,
        region_id: a.region_id + 99,
        ..a
    };
    assert!(!sut.release(&swapped, &mut freed));
    assert!(sut.release(&a, &mut freed));
    assert!(
        !sut.release(&a, &mut freed),
        "second release changes nothing"
    );
    assert_eq!(sut.stats().active_leases, 1, "the other lease is untouched");
    assert_eq!(check(&mut sut, &b, now), Ok(&"m"));
    assert_eq!(check(&mut sut, &a, now), Err(ShmError::LeaseInactive));
    assert!(freed.is_empty(), "still published");
}

#[test]
fn map_checks_come_in_the_reference_order() {
    let (mut sut, now) = (Leases::new(), Instant::now());
    let d = sut.offer("a", 100, TTL, now).unwrap();
    assert_eq!(
        check(
            &mut sut,
            &Descriptor {
                region_id: 999,
                ..d
            },
            now
        ),
        Err(ShmError::RegionGone)
    );
    assert_eq!(
        check(
            &mut sut,
            &Descriptor {
                generation: 999,
                ..d
            },
            now
        ),
        Err(ShmError::Stale)
    );
    assert_eq!(
        check(&mut sut, &Descriptor { lease_id: 999, ..d }, now),
        Err(ShmError::LeaseInactive)
    );
    assert_eq!(
        check(
            &mut sut,
            &Descriptor {
                offset: u64::MAX,
                len: 2,
                ..d
            },
            now
        ),
        Err(ShmError::RangeOverflow)
    );
    assert_eq!(
        check(
            &mut sut,
            &Descriptor {
                offset: 50,
                len: 51,
                ..d
            },
            now
        ),
        Err(ShmError::RangeInvalid)
    );
    assert_eq!(
        check(
            &mut sut,
            &Descriptor {
                offset: 50,
                len: 50,
                ..d
            },
            now
        ),
        Ok(&"a")
    );
    assert_eq!(check(&mut sut, &d, now + TTL), Err(ShmError::LeaseExpired));
    assert_eq!(
        sut.stats().regions,
        0,
        "the expired lease took its region along"
    );
}

#[test]
fn unpublish_refuses_new_opens_and_drains_existing_leases() {
    let (mut sut, now) = (Leases::new(), Instant::now());
    sut.publish("w", "w", 8).unwrap();
    let held = sut.open("w", TTL, now).unwrap();
    let mut freed = Vec::new();
    sut.unpublish("w", &mut freed).unwrap();
    assert_eq!(
        sut.open("w", TTL, now),
        Err(ShmError::NotFound { name: "w".into() })
    );
    assert_eq!(
        sut.unpublish("w", &mut freed),
        Err(ShmError::NotFound { name: "w".into() })
    );
    assert_eq!(
        check(&mut sut, &held, now),
        Ok(&"w"),
        "existing leases stay valid"
    );
    assert!(freed.is_empty());
    assert!(sut.release(&held, &mut freed));
    assert_eq!(freed, vec!["w"], "the region goes with the last lease");
    // An unleased published region goes at once.
    sut.publish("x", "x", 1).unwrap();
    sut.unpublish("x", &mut freed).unwrap();
    assert_eq!(freed, vec!["w", "x"]);
}

#[test]
fn names_are_unique_and_not_empty() {
    let mut sut = Leases::new();
    assert_eq!(sut.publish("", "a", 1), Err(ShmError::EmptyName));
    sut.publish("n", "a", 1).unwrap();
    assert_eq!(
        sut.publish("n", "b", 1),
        Err(ShmError::Exists { name: "n".into() })
    );
}

#[test]
fn expired_leases_are_reclaimed_in_deadline_order() {
    let (mut sut, now) = (Leases::new(), Instant::now());
    let short = sut.offer("short", 1, Duration::from_secs(1), now).unwrap();
    let long = sut.offer("long", 1, Duration::from_secs(5), now).unwrap();
    assert_eq!(sut.next_deadline(), Some(now + Duration::from_secs(1)));
    let mut freed = Vec::new();
    assert_eq!(sut.reclaim(now + Duration::from_secs(2), &mut freed), 1);
    assert_eq!(freed, vec!["short"]);
    assert_eq!(check(&mut sut, &short, now), Err(ShmError::RegionGone));
    assert_eq!(check(&mut sut, &long, now), Ok(&"long"));
    // A released lease's deadline is gone too.
    assert!(sut.release(&long, &mut freed));
    assert_eq!(sut.next_deadline(), None);
}

#[test]
fn a_huge_ttl_never_expires_and_never_panics() {
    let (mut sut, now) = (Leases::new(), Instant::now());
    let d = sut.offer("a", 1, Duration::MAX, now).unwrap();
    assert_eq!(sut.next_deadline(), None);
    assert_eq!(
        check(&mut sut, &d, now + Duration::from_secs(1 << 40)),
        Ok(&"a")
    );
}

#[test]
fn clear_revokes_everything() {
    let (mut sut, now) = (Leases::new(), Instant::now());
    sut.publish("p", "p", 3).unwrap();
    let d = sut.offer("o", 4, TTL, now).unwrap();
    let mut freed = Vec::new();
    sut.clear(&mut freed);
    freed.sort_unstable();
    assert_eq!(freed, vec!["o", "p"]);
    assert_eq!(sut.stats(), ShmStats::default());
    assert_eq!(check(&mut sut, &d, now), Err(ShmError::RegionGone));
}

#[test]
fn stats_count_regions_names_leases_and_bytes() {
    let (mut sut, now) = (Leases::new(), Instant::now());
    sut.publish("p", "p", 3).unwrap();
    sut.open("p", TTL, now).unwrap();
    sut.open("p", TTL, now).unwrap();
    sut.offer("o", 4, TTL, now).unwrap();
    assert_eq!(
        sut.stats(),
        ShmStats {
            regions: 2,
            published_regions: 1,
            active_leases: 3,
            bytes: 7
        }
    );
}
