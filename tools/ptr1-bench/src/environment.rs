//! What a benchmark ran on, recorded beside its results: kernel, CPU, cores, memory, commit,
//! io_uring availability, the tensorwire settings read from the environment.

/// The machine and build, as JSON.
pub(crate) fn describe() -> serde_json::Value {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .ok()
    };
    let cpu = read("/proc/cpuinfo").and_then(|info| {
        info.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
    });
    let memory = read("/proc/meminfo").and_then(|info| {
        info.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .map(|l| l.trim_start_matches("MemTotal:").trim().to_owned())
    });
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let settings: serde_json::Map<String, serde_json::Value> = std::env::vars()
        .filter(|(k, _)| k.starts_with("TENSORWIRE_") || k.starts_with("PULSING_"))
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    serde_json::json!({
        "kernel": read("/proc/sys/kernel/osrelease"),
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(usize::from).ok(),
        "memory": memory,
        "commit": commit,
        "io_uring": tensorwire_engine::io_uring_available().err().unwrap_or_else(|| "available".into()),
        "ptr1_bench_version": env!("CARGO_PKG_VERSION"),
        "settings": settings,
    })
}
