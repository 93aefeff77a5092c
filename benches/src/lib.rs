//! Criterion benchmarks for tensorwire; see `benches/`.
