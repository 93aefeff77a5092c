//! The pool's unit tests.

use super::*;

fn pool(quota: u64) -> Segments {
    Segments::new(SegmentsConfig {
        quota,
        idle_keep: 0,
        idle_after: Duration::ZERO,
    })
}

#[test]
fn classes_round_up_by_at_most_a_quarter() {
    assert_eq!(class(1), MIN_SLOT);
    assert_eq!(class(MIN_SLOT + 1), MIN_SLOT + (16 << 10));
    for len in [100_000, 1 << 20, (1 << 20) + 1, 3 << 20, 255 << 20, 1 << 28] {
        let c = class(len);
        assert!(
            c >= len && c % PAGE == 0 && (c - len) * 4 <= len.max(MIN_SLOT),
            "{len} → {c}"
        );
    }
    assert_eq!(class(1 << 28), 1 << 28);
}

#[test]
fn a_slot_comes_back_only_when_its_last_reference_drops() {
    let sut = pool(64 << 20);
    let mut slot = sut.take(1 << 20).unwrap();
    slot.as_mut_slice()[..5].copy_from_slice(b"hello");
    let segment = slot.segment().id;
    let frozen = slot.freeze();
    let bytes = frozen.bytes(0..5);
    let lease = Arc::clone(&frozen);
    drop(frozen);
    assert_eq!(sut.held_bytes(), class(1 << 20) as u64);
    drop(bytes);
    assert_eq!(
        sut.held_bytes(),
        class(1 << 20) as u64,
        "the lease still holds it"
    );
    drop(lease);
    assert_eq!(sut.held_bytes(), 0);
    let again = sut.take(1 << 20).unwrap();
    assert_eq!(again.segment().id, segment, "a warm slot is reused");
}

#[test]
fn a_held_slot_is_never_handed_out_again() {
    let sut = pool(64 << 20);
    let mut held = Vec::new();
    for _ in 0..slots_per_segment(class(1 << 20)) * 2 {
        let slot = sut.take(1 << 20).unwrap().freeze();
        assert!(held.iter().all(
            |s: &Arc<Slot>| s.segment().id != slot.segment().id || s.offset() != slot.offset()
        ));
        held.push(slot);
    }
    assert_eq!(sut.segment_count(), 2);
}

#[test]
fn a_full_quota_is_a_quota_error_and_credit_ends_the_wait() {
    let sut = pool(class(16 << 20) as u64);
    let held = sut.take(16 << 20).unwrap().freeze();
    assert!(matches!(sut.take(16 << 20), Err(ShmError::Quota { .. })));
    let until = Instant::now() + Duration::from_millis(30);
    assert!(sut.take_until(16 << 20, until).is_err());
    let giver = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
    });
    let got = sut.take_until(16 << 20, Instant::now() + Duration::from_secs(5));
    assert!(got.is_ok());
    giver.join().unwrap();
}

#[test]
fn a_peers_descriptor_cannot_be_mapped_or_upgraded_to_write() {
    use std::os::fd::AsRawFd;

    let sut = pool(64 << 20);
    let slot = sut.take(1 << 20).unwrap().freeze();
    let fd = slot.segment().read_only_fd().as_raw_fd();
    let len = slot.segment().len();
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a new mapping with no address hint; the kernel checks the descriptor.
    let writable = unsafe { libc::mmap(std::ptr::null_mut(), len, rw, libc::MAP_SHARED, fd, 0) };
    assert_eq!(
        writable,
        libc::MAP_FAILED,
        "a writable shared mapping is refused"
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    // SAFETY: as above, read-only.
    let view = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    assert_ne!(view, libc::MAP_FAILED);
    // SAFETY: `view` is the mapping just made, of `len` bytes.
    let upgraded = unsafe { libc::mprotect(view, len, rw) };
    assert_eq!(
        upgraded, -1,
        "the read-only mapping cannot be made writable"
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    // SAFETY: unmaps exactly the mapping made above.
    unsafe { libc::munmap(view, len) };
    // SAFETY: F_GET_SEALS takes no argument.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    let size = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    assert_eq!(
        seals & size,
        size,
        "its size can never change, nor its seals"
    );
}

#[test]
fn idle_segments_are_retired_and_reported_and_room_is_made_for_another_size() {
    let sut = pool(class(32 << 20) as u64);
    drop(sut.take(32 << 20).unwrap());
    assert_eq!(sut.segment_count(), 1);
    // Another size does not fit beside it: the idle one is retired to make room.
    let other = sut.take(20 << 20).unwrap();
    assert_eq!(sut.take_retired().len(), 1);
    drop(other);
    assert_eq!(sut.trim(Instant::now()), 1);
    assert_eq!(sut.segment_count(), 0);
    assert_eq!(sut.used_bytes(), 0);
}
