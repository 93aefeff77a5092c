//! The node's shared-memory manager on its memfd backend: the seed's lifecycle, each negative
//! path asserting its own error and the resources afterwards.

use std::time::Duration;

use bytes::Bytes;
use tensorwire_engine::shm::{ShmBackend, ShmError, ShmManager};
use tensorwire_tests::*;

const TTL: Duration = Duration::from_secs(30);

fn manager() -> ShmManager {
    ShmManager::new(ShmBackend::Memfd, 1 << 30)
}

fn dev_shm() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn offer_map_release_and_the_errors_after_release() {
    let sut = manager();
    let d = sut.offer(Bytes::from_static(b"tensor bytes"), TTL).unwrap();
    let view = sut.map(&d).unwrap();
    assert_eq!(&view[..], b"tensor bytes");
    assert!(sut.release(&d));
    assert!(!sut.release(&d), "a second release changes nothing");
    assert_eq!(sut.map(&d), Err(ShmError::RegionGone), "map after release");
    assert_eq!(
        &view[..],
        b"tensor bytes",
        "a view taken before stays valid"
    );
    let stats = sut.stats();
    assert_eq!(
        (stats.backend, stats.regions, stats.active_leases),
        ("memfd", 0, 0)
    );
}

#[test]
fn a_large_region_is_copied_in_whole() {
    // 20 MiB: copied in parts over the CPUs, around the caches.
    let sut = manager();
    let bytes: Vec<u8> = (0..20usize << 20)
        .map(|i| (i / 4093).to_le_bytes()[0])
        .collect();
    let d = sut.offer(Bytes::from(bytes.clone()), TTL).unwrap();
    assert!(sut.map(&d).unwrap()[..] == bytes[..]);
}

#[test]
fn a_lease_past_its_ttl_no_longer_maps() {
    let sut = manager();
    let d = sut
        .offer(Bytes::from_static(b"x"), Duration::from_millis(50))
        .unwrap();
    std::thread::sleep(Duration::from_millis(80));
    assert_eq!(sut.map(&d), Err(ShmError::LeaseExpired));
    assert_eq!(sut.stats().regions, 0, "the expired region was reclaimed");
}

#[test]
fn unpublish_refuses_new_opens_while_existing_leases_drain() {
    let sut = manager();
    sut.publish("weights", Bytes::from(vec![5u8; 4096]))
        .unwrap();
    let held = sut.open("weights", TTL).unwrap();
    sut.unpublish("weights").unwrap();
    assert_eq!(
        sut.open("weights", TTL),
        Err(ShmError::NotFound {
            name: "weights".into()
        })
    );
    assert_eq!(
        sut.unpublish("weights"),
        Err(ShmError::NotFound {
            name: "weights".into()
        })
    );
    assert_eq!(
        sut.map(&held).unwrap()[..],
        [5u8; 4096][..],
        "the existing lease still maps"
    );
    assert!(sut.release(&held));
    assert_eq!(sut.stats().regions, 0);
}

#[test]
fn clear_revokes_every_lease_and_name() {
    let sut = manager();
    sut.publish("a", Bytes::from_static(b"a")).unwrap();
    let d = sut.offer(Bytes::from_static(b"b"), TTL).unwrap();
    sut.clear();
    assert_eq!(sut.map(&d), Err(ShmError::RegionGone));
    assert!(sut.open("a", TTL).is_err());
    assert_eq!(sut.stats().regions, 0);
}

#[test]
fn a_loaned_slot_is_filled_in_place_and_never_written_again_while_it_is_offered() {
    let sut = manager();
    let mut loan = sut.loan(1 << 20).unwrap();
    loan.as_mut_slice().fill(9);
    let d = loan.offer(TTL).unwrap();
    let view = sut.map(&d).unwrap();
    // Loans of the same size come and go meanwhile: none of them gets the offered slot.
    for round in 0..64u8 {
        let mut other = sut.loan(1 << 20).unwrap();
        other.as_mut_slice().fill(round);
        drop(other.freeze());
    }
    assert!(view.iter().all(|&b| b == 9), "never written for a reader");
    assert!(sut.map(&d).unwrap().iter().all(|&b| b == 9));
}

#[test]
fn a_window_that_outlives_its_freeze_writes_privately_never_into_the_frozen_bytes() {
    let sut = manager();
    let mut loan = sut.loan(1 << 20).unwrap();
    let mut window = loan.window().unwrap();
    // SAFETY: the window maps the loan's 1 MiB writable until it drops.
    let through = unsafe { std::slice::from_raw_parts_mut(window.as_ptr(), 1 << 20) };
    through.fill(5);
    assert!(
        loan.as_mut_slice().iter().all(|&b| b == 5),
        "the window is the loan's memory"
    );
    window.privatize().unwrap();
    let frozen = loan.freeze();
    // A pointer kept past the freeze (numpy.ndarray(buffer=), torch.frombuffer) still reads
    // the bytes, and its writes stay private.
    assert!(through.iter().all(|&b| b == 5));
    through.fill(6);
    assert!(
        frozen.iter().all(|&b| b == 5),
        "the frozen bytes did not change"
    );
    drop(window);
    assert!(frozen.iter().all(|&b| b == 5));
}

#[test]
fn a_reservation_over_the_quota_is_a_clean_error() {
    let sut = ShmManager::new(ShmBackend::Memfd, 1 << 20);
    let err = sut.loan(2 << 20).unwrap_err();
    assert!(
        matches!(err, ShmError::Quota { requested, quota, .. } if requested >= 2 << 20 && quota == 1 << 20),
        "{err}"
    );
    let err = sut.offer(Bytes::from(vec![0u8; 2 << 20]), TTL).unwrap_err();
    assert!(matches!(err, ShmError::Quota { .. }), "{err}");
    // Still usable below it, and the failed reservations left nothing charged.
    assert_eq!(sut.quota_used(), 0);
    let d = sut.offer(Bytes::from(vec![1u8; 4096]), TTL).unwrap();
    assert!(sut.release(&d));
}

#[test]
fn ten_thousand_offer_release_cycles_leak_no_descriptors_or_memory() {
    let _serial = serial();
    let sut = manager();
    let shm = dev_shm();
    let payload = Bytes::from(vec![3u8; 64 << 10]);
    // The first cycle makes the warm segment (two descriptors that stay, by design).
    let warm = sut.offer(payload.clone(), TTL).unwrap();
    assert!(sut.release(&warm));
    let fds = open_fd_count();
    let rss = resident_bytes();
    for _ in 0..10_000 {
        let d = sut.offer(payload.clone(), TTL).unwrap();
        assert_eq!(sut.map(&d).unwrap().len(), 64 << 10);
        assert!(sut.release(&d));
    }
    let after = settle_fds(fds);
    assert!(
        after <= fds,
        "no descriptor left open by the cycles ({fds} -> {after})"
    );
    assert_eq!(sut.held_bytes(), 0, "every region's slot went back");
    assert!(
        sut.quota_used() <= 4 << 20,
        "one warm segment, not one per cycle"
    );
    assert!(
        resident_bytes() < rss + (64 << 20),
        "resident memory did not grow with the cycles"
    );
    assert_eq!(dev_shm(), shm, "nothing was created in /dev/shm");
}

#[test]
fn the_in_process_backend_aliases_the_same_bytes() {
    let sut = ShmManager::new(ShmBackend::InProcess, 0);
    let bytes = Bytes::from(vec![4u8; 100]);
    let d = sut.offer(bytes.clone(), TTL).unwrap();
    let view = sut.map(&d).unwrap();
    assert_eq!(view.as_ptr(), bytes.as_ptr(), "no copy");
    assert_eq!(sut.stats().backend, "in_process");
}
