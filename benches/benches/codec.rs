//! Encode and decode throughput of the PTR1 and PTM1 codecs with 1, 16 and 1,024 buffers.
//!
//! Run: `cargo bench -p tensorwire-benches --bench codec`.
//!
//! Every message carries 4 MiB of payload split evenly over its buffers, so the figures show
//! what the per-buffer cost is. Encoding never touches payload (it is O(buffers)); the
//! contiguous decode returns slices (also O(buffers)); the streamed decode copies every payload
//! byte once from 64 KiB input chunks into freshly allocated final memory, as a receiver does.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tensorwire_proto::{Limits, TensorMessage, ptm1, ptr1};

const PAYLOAD: usize = 4 << 20;
const CHUNK: usize = 64 << 10;
const BUFFER_COUNTS: [usize; 3] = [1, 16, 1024];

fn message(buffers: usize) -> TensorMessage {
    let each = PAYLOAD / buffers;
    let payload: Vec<Bytes> = (0..buffers)
        .map(|i| Bytes::from(vec![u8::try_from(i % 251).unwrap(); each]))
        .collect();
    TensorMessage::new(
        1,
        Bytes::from_static(b"{\"dtype\":\"f32\",\"shape\":[1024,1024]}"),
        payload,
    )
}

fn ask(buffers: usize) -> ptr1::Frame {
    ptr1::Frame::Ask {
        path: "/actors/bench".to_owned(),
        message: message(buffers),
    }
}

fn ptr1_codec(c: &mut Criterion) {
    let limits = Limits::default();
    let mut group = c.benchmark_group("ptr1");
    for n in BUFFER_COUNTS {
        let frame = ask(n);
        let encoded = ptr1::encode(&frame, &limits).unwrap();
        let wire = Bytes::from(encoded.to_vec());
        group.throughput(Throughput::Bytes(encoded.wire_len()));
        group.bench_with_input(BenchmarkId::new("encode", n), &frame, |b, frame| {
            b.iter(|| ptr1::encode(black_box(frame), &limits).unwrap())
        });
        group.bench_with_input(
            BenchmarkId::new("decode_contiguous", n),
            &wire,
            |b, wire| b.iter(|| ptr1::decode(black_box(wire.clone()), &limits).unwrap()),
        );
        group.bench_with_input(
            BenchmarkId::new("decode_streamed_64KiB", n),
            &wire,
            |b, wire| {
                b.iter(|| {
                    let mut decoder = ptr1::Decoder::new(limits);
                    let mut frame = None;
                    for chunk in wire.chunks(CHUNK) {
                        let (_, done) = decoder.decode(black_box(chunk)).unwrap();
                        frame = frame.or(done);
                    }
                    frame.unwrap()
                })
            },
        );
    }
    group.finish();
}

fn ptm1_codec(c: &mut Criterion) {
    let limits = Limits::default();
    let mut group = c.benchmark_group("ptm1");
    for n in BUFFER_COUNTS {
        let message = message(n);
        let encoded = ptm1::encode(&message, &limits).unwrap();
        let wire = Bytes::from(encoded.to_vec());
        group.throughput(Throughput::Bytes(encoded.wire_len()));
        group.bench_with_input(BenchmarkId::new("encode", n), &message, |b, message| {
            b.iter(|| ptm1::encode(black_box(message), &limits).unwrap())
        });
        group.bench_with_input(
            BenchmarkId::new("decode_streamed_64KiB", n),
            &wire,
            |b, wire| {
                b.iter(|| {
                    let mut decoder = ptm1::Decoder::new(limits);
                    wire.chunks(CHUNK)
                        .for_each(|chunk| decoder.push(black_box(chunk)).unwrap());
                    decoder.finish().unwrap()
                })
            },
        );
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

criterion_group! { name = benches; config = config(); targets = ptr1_codec, ptm1_codec }
criterion_main!(benches);
