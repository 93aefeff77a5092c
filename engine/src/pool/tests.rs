//! The receive pool: slot reuse, bounds, and giving memory back.

use super::*;

fn pool(min_pooled_bytes: usize, max_idle_bytes: usize) -> ReceivePool {
    ReceivePool::new(PoolConfig {
        min_pooled_bytes,
        max_idle_bytes,
        ..PoolConfig::default()
    })
}

/// Fills a slot the way a completed receive does, and freezes it.
fn filled(pool: &ReceivePool, len: usize, byte: u8) -> Bytes {
    let mut buffer = pool.take(len).unwrap();
    buffer.as_mut().fill(byte);
    buffer.freeze()
}

#[test]
fn class_sizes_have_at_most_a_quarter_of_slack() {
    for len in [256 << 10, (256 << 10) + 1, 3 << 20, (64 << 20) + 5, 1 << 30] {
        let class = class_size(len);
        assert!(class >= len && class % PAGE == 0, "{len} -> {class}");
        assert!(
            (class - len) as f64 <= len as f64 / 4.0 + PAGE as f64,
            "{len} -> {class}"
        );
    }
}

#[test]
fn slot_returns_to_the_pool_when_the_last_bytes_drops() {
    let sut = pool(4096, 64 << 20);
    let bytes = filled(&sut, 3 << 20, 7);
    let clone = bytes.slice(10..20);
    drop(bytes);
    assert_eq!(
        sut.stats().idle_bytes,
        0,
        "a slice still refers to the slot"
    );
    assert_eq!(&clone[..], &[7; 10]);
    drop(clone);
    assert_eq!(sut.stats().idle_bytes, len_u64(class_size(3 << 20)));
    let again = sut.take(3 << 20).unwrap();
    assert_eq!(again.as_ref().len(), 3 << 20);
    let stats = sut.stats();
    assert_eq!((stats.hits, stats.misses, stats.idle_bytes), (1, 1, 0));
}

#[test]
fn a_reused_slot_says_it_is_committed_and_a_fresh_one_only_as_far_as_it_was_prepared() {
    let sut = pool(4096, 64 << 20);
    let mut fresh = sut.take(3 << 20).unwrap();
    assert_eq!(ReceiveBuffer::committed(&fresh), 0);
    ReceiveBuffer::prepare(&mut fresh, 0..(1 << 20));
    assert_eq!(ReceiveBuffer::committed(&fresh), 1 << 20);
    drop(fresh); // failed half-way: unmapped, not kept
    drop(filled(&sut, 3 << 20, 1));
    let reused = sut.take(3 << 20).unwrap();
    assert_eq!(sut.stats().hits, 1);
    assert_eq!(ReceiveBuffer::committed(&reused), 3 << 20);
    assert_eq!(RecvStorage::committed(&reused), 3 << 20);
    let heap = sut.take(100).unwrap();
    assert_eq!(
        ReceiveBuffer::committed(&heap),
        0,
        "heap sections claim nothing"
    );
}

#[test]
fn a_slot_of_a_frame_that_failed_half_way_is_unmapped_not_kept() {
    let sut = pool(4096, 64 << 20);
    let mut buffer = sut.take(8 << 20).unwrap();
    ReceiveBuffer::prepare(&mut buffer, 0..(1 << 20));
    drop(buffer);
    assert_eq!(sut.stats().idle_bytes, 0);
}

#[test]
fn idle_memory_is_bounded() {
    let sut = pool(4096, 1 << 20);
    let a = filled(&sut, 768 << 10, 1);
    let b = filled(&sut, 768 << 10, 2);
    drop(a);
    drop(b);
    assert_eq!(
        sut.stats().idle_bytes,
        768 << 10,
        "the second slot did not fit and was unmapped"
    );
}

#[test]
fn idle_slots_unused_for_the_ttl_go_back_to_the_system() {
    let sut = ReceivePool::new(PoolConfig {
        min_pooled_bytes: 4096,
        idle_keep_bytes: 0,
        ..PoolConfig::default()
    });
    drop(filled(&sut, 4 << 20, 1));
    drop(filled(&sut, 4 << 20, 2));
    assert_eq!(sut.stats().idle_bytes, len_u64(class_size(4 << 20)));
    assert_eq!(sut.release_unused(Instant::now()), 0, "not old enough");
    let later = Instant::now() + Duration::from_secs(3);
    assert_eq!(sut.release_unused(later), 1);
    let stats = sut.stats();
    assert_eq!((stats.idle_bytes, stats.released), (0, 1));
}

#[test]
fn after_the_ttl_only_the_most_recently_used_slots_within_the_cache_stay() {
    let sut = ReceivePool::new(PoolConfig {
        min_pooled_bytes: 4096,
        idle_keep_bytes: 12 << 20,
        ..PoolConfig::default()
    });
    // Used in this order, so the 8 MiB slot is the most recent and the 4 MiB one next.
    let [a, b, c] = [2 << 20, 4 << 20, 8 << 20].map(|len| filled(&sut, len, 1));
    for bytes in [a, b, c] {
        drop(bytes);
        std::thread::sleep(Duration::from_millis(2));
    }
    let later = Instant::now() + Duration::from_secs(3);
    assert_eq!(sut.release_unused(later), 1, "only the oldest slot goes");
    assert_eq!(sut.stats().idle_bytes, 12 << 20);
    assert!(
        sut.take(4 << 20).is_ok() && sut.stats().hits == 1,
        "kept slots are reused"
    );
    assert_eq!(
        sut.release_unused(later + Duration::from_secs(60)),
        0,
        "a cache stays"
    );
}

#[test]
fn address_space_for_sections_still_arriving_is_bounded() {
    let sut = ReceivePool::new(PoolConfig {
        min_pooled_bytes: 4096,
        max_reserved_bytes: 8 << 20,
        ..PoolConfig::default()
    });
    let first = sut.take(6 << 20).unwrap();
    let refused = sut.take(4 << 20).unwrap_err();
    assert!(refused.to_string().contains("address space"), "{refused}");
    let frozen = filled(&sut, 2 << 20, 1);
    drop(first); // a failed frame's section gives its reservation back
    let again = sut.take(6 << 20).unwrap();
    drop((again, frozen));
}

#[test]
fn small_sections_come_from_the_heap() {
    let sut = ReceivePool::new(PoolConfig::default());
    let buffer = sut.take(100).unwrap();
    assert!(!buffer.is_pooled());
    assert_eq!(buffer.freeze().len(), 100);
    assert_eq!(sut.stats().heap, 1);
}

#[test]
fn the_budget_refuses_what_does_not_fit_and_takes_back_what_is_released() {
    let sut = ReceivePool::new(PoolConfig {
        max_receiving_bytes: 100,
        ..PoolConfig::default()
    });
    assert!(sut.charge(60));
    assert!(!sut.charge(41));
    sut.release(60);
    assert!(sut.charge(100));
    assert_eq!(sut.stats().receiving_bytes, 100);
}

#[test]
fn a_slot_cut_into_parts_filled_on_other_threads_freezes_whole_and_returns_to_the_pool() {
    let sut = pool(4096, 64 << 20);
    let len = (3 << 20) + 123;
    let ranges = [0..(1 << 20), (1 << 20)..(2 << 20), (2 << 20)..len];
    let split = sut.allocate_split(len, &ranges).unwrap();
    std::thread::scope(|scope| {
        for (i, mut part) in split.parts.into_iter().enumerate() {
            scope.spawn(move || {
                ReceiveBuffer::prepare(&mut part, 0..4096);
                let len = part.as_mut().len();
                ReceiveBuffer::prepare(&mut part, 4096..len);
                part.as_mut().fill(u8::try_from(i + 1).unwrap());
            });
        }
    });
    let Ok(whole) = split.joiner.join() else {
        panic!("every part was dropped");
    };
    assert_eq!(whole.len(), len);
    for (i, range) in ranges.iter().enumerate() {
        assert!(
            whole[range.clone()]
                .iter()
                .all(|&b| usize::from(b) == i + 1)
        );
    }
    drop(whole);
    assert_eq!(
        sut.stats().idle_bytes,
        len_u64(class_size(len)),
        "back in the pool, warm"
    );
}

#[test]
fn a_cut_slot_does_not_join_while_a_part_lives() {
    let sut = pool(4096, 64 << 20);
    let split = sut.allocate_split(1 << 20, &[0..(512 << 10), (512 << 10)..(1 << 20)]);
    let split = split.unwrap();
    let mut parts = split.parts;
    let kept = parts.pop();
    drop(parts);
    let Err(joiner) = split.joiner.join() else {
        panic!("joined while a part lives");
    };
    drop(kept);
    assert!(joiner.join().is_ok());
}

/// The `VmFlags` line of the mapping of `/proc/self/smaps` that holds `addr`.
fn vm_flags_at(addr: usize) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((from, to)) = range.split_once('-')
            && let (Ok(from), Ok(to)) = (
                usize::from_str_radix(from, 16),
                usize::from_str_radix(to, 16),
            )
        {
            inside = (from..to).contains(&addr);
        } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
            return flags.trim().to_owned();
        }
    }
    panic!("no mapping of /proc/self/smaps holds {addr:#x}");
}

#[test]
fn slots_ask_for_huge_pages_when_configured_and_refuse_them_otherwise() {
    // A kernel without transparent huge pages refuses both pieces of advice: no flag then.
    let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
    for huge_pages in [false, true] {
        let sut = ReceivePool::new(PoolConfig {
            min_pooled_bytes: 4096,
            huge_pages,
            ..PoolConfig::default()
        });
        let slot = sut.take(8 << 20).unwrap();
        let flags = vm_flags_at(slot.as_ref().as_ptr() as usize);
        let words: Vec<&str> = flags.split_whitespace().collect();
        // Readable, writable, reserving no swap: the slot's own mapping (`MAP_NORESERVE`).
        for own in ["rd", "wr", "nr"] {
            assert!(words.contains(&own), "not the slot's mapping: {flags}");
        }
        assert_eq!(
            (words.contains(&"hg"), words.contains(&"nh")),
            (thp && huge_pages, thp && !huge_pages),
            "huge_pages = {huge_pages}, VmFlags: {flags}"
        );
    }
}
