//! Statistics, the machine description, and result files.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub memory_gib: f64,
    pub cpu: String,
}

impl Machine {
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kib: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        Machine { cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), memory_gib: kib / 1048576.0, cpu }
    }
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} cores, {:.1} GiB, {}", self.cores, self.memory_gib, self.cpu)
    }
}

/// Median, p99 and max of a set of durations, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub n: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The middle value of `v` (the upper of the two middle ones for an even count), 0 when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub fn summarize(samples: &[Duration]) -> Summary {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| -> f64 {
        if ms.is_empty() {
            return 0.0;
        }
        let i = ((ms.len() as f64 - 1.0) * q).round() as usize;
        ms[i.min(ms.len() - 1)]
    };
    let mean_ms = if ms.is_empty() { 0.0 } else { ms.iter().sum::<f64>() / ms.len() as f64 };
    Summary { n: ms.len(), mean_ms, p50_ms: pick(0.5), p99_ms: pick(0.99), max_ms: ms.last().copied().unwrap_or(0.0) }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (n={})", self.p50_ms, self.p99_ms, self.max_ms, self.n)
    }
}

/// One scenario's outcome: its name, parameters and measured values.
pub struct ScenarioResult {
    pub name: &'static str,
    pub params: Value,
    pub values: Value,
}

pub fn write(dir: &Path, machine: &Machine, r: &ScenarioResult) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let doc = serde_json::json!({"scenario": r.name, "machine": machine, "params": r.params, "results": r.values,
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)});
    let path = dir.join(format!("{}.json", r.name));
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("wrote {}", path.display());
    Ok(())
}
