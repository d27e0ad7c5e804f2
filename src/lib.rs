//! pfs root package: the admin CLI (later), integration tests in `tests/` and the
//! criterion benchmarks in `benches/`. The file system itself lives in `crates/`.
