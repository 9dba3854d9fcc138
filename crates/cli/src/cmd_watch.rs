//! `gpumem watch`: each GPU's memory as NVML sees it (total, used, free, the driver's own
//! reservation, per-process use), plus the figures of gpumem pools that PyTorch processes
//! export, live in the terminal or as one sample (`--once`, `--json`).
//!
//! NVML (`libnvidia-ml.so.1`) is loaded at run time by nvml-wrapper: a machine without the
//! NVIDIA driver builds and runs gpumem, and `watch` says why there is nothing to watch; given
//! `--pool-stats`, it says so once and shows the pools, which need no driver to be read. With
//! no driver and no pool statistics either, the live view stops as `--once` does (an error:
//! nothing to watch) before it takes the terminal.
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use serde::Serialize;

use crate::units::human_bytes;

/// Arguments of `gpumem watch`.
#[derive(Args)]
pub struct WatchArgs {
    /// Which GPUs: `all`, `cuda` (= cuda:0) or `cuda:N`.
    #[arg(long, default_value = "all")]
    pub device: String,
    /// Time between samples (`1s`, `500ms`, `2`: seconds).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Print one sample and exit (no terminal needed).
    #[arg(long)]
    pub once: bool,
    /// With --once: print the sample as JSON.
    #[arg(long, requires = "once")]
    pub json: bool,
    /// A folder of gpumem pool statistics (`*.json`, one per process, as the PyTorch plug-in's
    /// `gpumem_stats_json` writes them); default `$GPUMEM_STATS_DIR` when set and not empty.
    // Read by `pool_dir`, not by clap's `env`: an empty variable made clap say "a value is
    // required for '--pool-stats'" to a user who gave no --pool-stats.
    #[arg(long, value_name = "DIR")]
    pub pool_stats: Option<PathBuf>,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v * scale >= 0.05 && v.is_finite() => Ok(Duration::from_secs_f64(v * scale)),
        Ok(_) => Err(format!("`{s}`: expected an interval of at least 50ms")),
        Err(_) => Err(format!(
            "`{s}`: expected an interval such as 1s, 500ms or 2"
        )),
    }
}

/// One process on one GPU.
#[derive(Debug, Clone, Serialize)]
struct ProcessSample {
    pid: u32,
    /// `/proc/PID/comm`, when readable.
    name: Option<String>,
    /// Bytes NVML counts for it (`None` where NVML does not say).
    used_bytes: Option<u64>,
}

/// One GPU.
#[derive(Debug, Clone, Serialize)]
struct DeviceSample {
    index: u32,
    name: String,
    total_bytes: u64,
    used_bytes: u64,
    free_bytes: u64,
    /// Memory the driver and firmware set aside (nvmlDeviceGetMemoryInfo_v2 `reserved`).
    driver_reserved_bytes: u64,
    /// Used bytes not counted to any listed process (contexts, the driver's own use).
    unattributed_bytes: u64,
    processes: Vec<ProcessSample>,
}

/// Figures of one gpumem pool, from a stats file.
#[derive(Debug, Clone, Serialize)]
struct PoolSample {
    source: String,
    device: Option<u64>,
    strategy: Option<String>,
    reserved_bytes: Option<u64>,
    reserved_peak_bytes: Option<u64>,
    allocated_bytes: Option<u64>,
    allocated_peak_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
struct Sample {
    /// Why there are no devices: NVML could not be opened (`None` when it was).
    nvml_error: Option<String>,
    driver_version: Option<String>,
    devices: Vec<DeviceSample>,
    pools: Vec<PoolSample>,
}

/// NVML, or what is missing (`run` says what that leaves).
fn open_nvml() -> Result<Nvml> {
    use nvml_wrapper::error::NvmlError;
    Nvml::init().map_err(|e| match e {
        // The library is not there: no driver is installed.
        NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound => {
            anyhow::anyhow!("no NVIDIA driver (libnvidia-ml.so.1, NVML) found")
        }
        NvmlError::DriverNotLoaded => anyhow::anyhow!(
            "NVML: the NVIDIA driver is installed but not loaded (nvidia-smi says why)"
        ),
        other => anyhow::anyhow!("cannot initialise NVML (libnvidia-ml.so.1): {other}"),
    })
}

fn selected(spec: &str, count: u32) -> Result<Vec<u32>> {
    if count == 0 {
        bail!("NVML sees no GPU on this machine: nothing to watch");
    }
    let n = match spec {
        "all" => return Ok((0..count).collect()),
        "cuda" => 0,
        other => match other.strip_prefix("cuda:").map(str::parse::<u32>) {
            Some(Ok(n)) => n,
            _ => bail!("--device {other}: expected all, cuda or cuda:N"),
        },
    };
    if n >= count {
        bail!(
            "--device cuda:{n}: this machine has {count} GPU(s) (cuda:0 to cuda:{})",
            count - 1
        );
    }
    Ok(vec![n])
}

/// The variable that gives the pool statistics folder when `--pool-stats` does not.
const STATS_DIR_VAR: &str = "GPUMEM_STATS_DIR";

/// The folder of pool statistics (`--pool-stats`, else a non-empty `$GPUMEM_STATS_DIR`),
/// checked to be a folder (a file or a missing folder is a typo more often than a folder still
/// to be made; the error names where it came from).
fn pool_dir(flag: Option<&PathBuf>) -> Result<Option<PathBuf>> {
    let (dir, from) = match flag {
        Some(d) => (d.clone(), "--pool-stats "),
        None => match std::env::var_os(STATS_DIR_VAR).filter(|v| !v.is_empty()) {
            Some(v) => (PathBuf::from(v), "GPUMEM_STATS_DIR="),
            None => return Ok(None),
        },
    };
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(Some(dir)),
        Ok(_) => bail!(
            "{from}{}: a file; expected the folder of gpumem pool statistics (*.json)",
            dir.display()
        ),
        Err(e) => bail!("{from}{}: {}", dir.display(), e),
    }
}

/// The pools of the stats files in `dir`, and a note for each `*.json` file read but skipped.
fn pools(dir: Option<&PathBuf>) -> (Vec<PoolSample>, Vec<String>) {
    let mut notes = Vec::new();
    let Some(dir) = dir else {
        return (Vec::new(), notes);
    };
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            notes.push(format!("{}: {}", dir.display(), e));
            return (Vec::new(), notes);
        }
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for p in files {
        let text = match std::fs::read_to_string(&p) {
            Ok(t) => t,
            Err(e) => {
                notes.push(format!("{}: {}, skipped", p.display(), e));
                continue;
            }
        };
        let v = match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) => v,
            Err(e) => {
                notes.push(format!(
                    "{}: not JSON (line {}, column {}), skipped",
                    p.display(),
                    e.line(),
                    e.column()
                ));
                continue;
            }
        };
        let objs: Vec<&serde_json::Value> = match &v {
            serde_json::Value::Array(a) => a.iter().collect(),
            o => vec![o],
        };
        for o in objs {
            let u = |k: &str| o.get(k).and_then(serde_json::Value::as_u64);
            out.push(PoolSample {
                source: p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                device: u("device"),
                strategy: o.get("strategy").and_then(|s| s.as_str()).map(String::from),
                reserved_bytes: u("reserved_bytes.all.current"),
                reserved_peak_bytes: u("reserved_bytes.all.peak"),
                allocated_bytes: u("allocated_bytes.all.current"),
                allocated_peak_bytes: u("allocated_bytes.all.peak"),
            });
        }
    }
    (out, notes)
}

/// One sample: the devices `which` (none without NVML, `nvml_error` then says why) and the
/// pools of `pool_dir`, with the notes of the stats files skipped.
fn sample(
    nvml: Option<&Nvml>,
    nvml_error: Option<&str>,
    which: &[u32],
    pool_dir: Option<&PathBuf>,
) -> Result<(Sample, Vec<String>)> {
    let mut devices = Vec::new();
    for &i in which {
        let Some(nvml) = nvml else { break };
        let d = nvml
            .device_by_index(i)
            .with_context(|| format!("NVML: device {i}"))?;
        let m = d
            .memory_info()
            .with_context(|| format!("NVML: memory of device {i}"))?;
        let procs = d.running_compute_processes().unwrap_or_default();
        let processes: Vec<ProcessSample> = procs
            .iter()
            .map(|p| ProcessSample {
                pid: p.pid,
                name: std::fs::read_to_string(format!("/proc/{}/comm", p.pid))
                    .ok()
                    .map(|s| s.trim().to_string()),
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
        let attributed: u64 = processes.iter().filter_map(|p| p.used_bytes).sum();
        devices.push(DeviceSample {
            index: i,
            name: d.name().unwrap_or_else(|_| "unknown".into()),
            total_bytes: m.total,
            used_bytes: m.used,
            free_bytes: m.free,
            driver_reserved_bytes: m.reserved,
            unattributed_bytes: m.used.saturating_sub(attributed),
            processes,
        });
    }
    let (pools, notes) = pools(pool_dir);
    Ok((
        Sample {
            nvml_error: nvml_error.map(String::from),
            driver_version: nvml.and_then(|n| n.sys_driver_version().ok()),
            devices,
            pools,
        },
        notes,
    ))
}

fn text(s: &Sample) -> String {
    let mut o = String::new();
    if let Some(v) = &s.driver_version {
        o.push_str(&format!("driver {v}\n"));
    }
    for d in &s.devices {
        o.push_str(&format!(
            "cuda:{} {}: {} used of {} ({:.1} %), {} free; driver reserved {}, not counted to a process {}\n",
            d.index,
            d.name,
            human_bytes(d.used_bytes),
            human_bytes(d.total_bytes),
            100.0 * d.used_bytes as f64 / d.total_bytes.max(1) as f64,
            human_bytes(d.free_bytes),
            human_bytes(d.driver_reserved_bytes),
            human_bytes(d.unattributed_bytes),
        ));
        for p in &d.processes {
            o.push_str(&format!(
                "  pid {:>8} {:<20} {}\n",
                p.pid,
                p.name.as_deref().unwrap_or("?"),
                p.used_bytes.map_or("n/a".into(), human_bytes)
            ));
        }
    }
    for p in &s.pools {
        o.push_str(&format!(
            "gpumem pool {} (device {}, {}): reserved {} (peak {}), allocated {} (peak {})\n",
            p.source,
            p.device.map_or("?".into(), |d| d.to_string()),
            p.strategy.as_deref().unwrap_or("?"),
            p.reserved_bytes.map_or("n/a".into(), human_bytes),
            p.reserved_peak_bytes.map_or("n/a".into(), human_bytes),
            p.allocated_bytes.map_or("n/a".into(), human_bytes),
            p.allocated_peak_bytes.map_or("n/a".into(), human_bytes),
        ));
    }
    o
}

pub fn run(a: WatchArgs) -> Result<()> {
    let pool_stats = pool_dir(a.pool_stats.as_ref())?;
    // Without NVML, the pools of --pool-stats can still be shown: say once what is missing.
    let (nvml, nvml_error) = match (open_nvml(), &pool_stats) {
        (Ok(n), _) => (Some(n), None),
        (Err(e), Some(_)) => (None, Some(e.to_string())),
        (Err(e), None) => bail!("{e}: there is no GPU to watch"),
    };
    let which = match &nvml {
        Some(n) => selected(&a.device, n.device_count().context("NVML: device count")?)?,
        None => Vec::new(),
    };
    // The live view stops where `--once` does: without NVML and without a pool, before it
    // takes the terminal (it showed an empty screen until `q`).
    let (s, notes) = sample(
        nvml.as_ref(),
        nvml_error.as_deref(),
        &which,
        pool_stats.as_ref(),
    )?;
    for n in &notes {
        eprintln!("note: {n}");
    }
    if let (Some(e), Some(dir)) = (&nvml_error, &pool_stats) {
        if s.pools.is_empty() {
            bail!(
                "{e}, and {} holds no gpumem pool statistics (*.json, as the PyTorch plug-in's gpumem_stats_json writes them): nothing to watch",
                dir.display()
            );
        }
        if a.once {
            eprintln!(
                "note: {e}: no GPU figures, only the gpumem pools of {}",
                dir.display()
            );
        }
    }
    if a.once {
        if a.json {
            println!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            print!("{}", text(&s));
        }
        return Ok(());
    }
    if !std::io::stdout().is_terminal() {
        bail!("the live view needs a terminal: use --once (and --json) in scripts");
    }
    live(
        s,
        nvml.as_ref(),
        nvml_error.as_deref(),
        &which,
        pool_stats.as_ref(),
        a.interval,
    )
}

/// The live view from the first sample `first`, a sample every `interval` until `q` or Esc.
fn live(
    first: Sample,
    nvml: Option<&Nvml>,
    nvml_error: Option<&str>,
    which: &[u32],
    pool_dir: Option<&PathBuf>,
    interval: Duration,
) -> Result<()> {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
    let mut terminal = ratatui::init();
    let result = (|| -> Result<()> {
        let mut s = first;
        let mut last = Instant::now();
        loop {
            terminal.draw(|f| draw(f, &s, interval))?;
            let wait = interval.saturating_sub(last.elapsed());
            if event::poll(wait)? {
                if let Event::Key(k) = event::read()? {
                    if k.kind == KeyEventKind::Press
                        && matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
                    {
                        return Ok(());
                    }
                }
            }
            if last.elapsed() >= interval {
                s = sample(nvml, nvml_error, which, pool_dir)?.0;
                last = Instant::now();
            }
        }
    })();
    ratatui::restore();
    result
}

fn draw(f: &mut ratatui::Frame, s: &Sample, interval: Duration) {
    use ratatui::layout::{Constraint, Layout};
    use ratatui::style::{Color, Style, Stylize};
    use ratatui::text::Line;
    use ratatui::widgets::{Block, Gauge, Paragraph, Row, Table};

    let mut constraints = vec![Constraint::Length(1)];
    for d in &s.devices {
        constraints.push(Constraint::Length(3));
        constraints.push(Constraint::Length(d.processes.len() as u16 + 2));
    }
    if !s.pools.is_empty() {
        constraints.push(Constraint::Length(s.pools.len() as u16 + 3));
    }
    constraints.push(Constraint::Min(0));
    let areas = Layout::vertical(constraints).split(f.area());
    let source = match &s.nvml_error {
        Some(e) => format!("{e}: gpumem pools only"),
        None => format!("driver {}", s.driver_version.as_deref().unwrap_or("?")),
    };
    f.render_widget(
        Paragraph::new(Line::from(format!(
            "gpumem watch: {source}, every {:.1} s; q quits",
            interval.as_secs_f64()
        )))
        .bold(),
        areas[0],
    );
    let mut k = 1;
    for d in &s.devices {
        let ratio = (d.used_bytes as f64 / d.total_bytes.max(1) as f64).clamp(0.0, 1.0);
        let g = Gauge::default()
            .block(Block::bordered().title(format!(
                " cuda:{} {}: {} free; driver reserved {}, not counted to a process {} ",
                d.index,
                d.name,
                human_bytes(d.free_bytes),
                human_bytes(d.driver_reserved_bytes),
                human_bytes(d.unattributed_bytes)
            )))
            .gauge_style(Style::default().fg(if ratio > 0.9 {
                Color::Red
            } else {
                Color::Green
            }))
            .ratio(ratio)
            .label(format!(
                "{} of {} used ({:.1} %)",
                human_bytes(d.used_bytes),
                human_bytes(d.total_bytes),
                ratio * 100.0
            ));
        f.render_widget(g, areas[k]);
        let rows: Vec<Row> = d
            .processes
            .iter()
            .map(|p| {
                Row::new(vec![
                    p.pid.to_string(),
                    p.name.clone().unwrap_or_else(|| "?".into()),
                    p.used_bytes.map_or("n/a".into(), human_bytes),
                ])
            })
            .collect();
        let t = Table::new(
            rows,
            [
                Constraint::Length(10),
                Constraint::Min(20),
                Constraint::Length(14),
            ],
        )
        .header(Row::new(vec!["pid", "process", "used"]).bold());
        f.render_widget(t, areas[k + 1]);
        k += 2;
    }
    if !s.pools.is_empty() {
        let rows: Vec<Row> = s
            .pools
            .iter()
            .map(|p| {
                Row::new(vec![
                    p.source.clone(),
                    p.device.map_or("?".into(), |d| d.to_string()),
                    p.strategy.clone().unwrap_or_default(),
                    p.reserved_bytes.map_or("n/a".into(), human_bytes),
                    p.reserved_peak_bytes.map_or("n/a".into(), human_bytes),
                    p.allocated_bytes.map_or("n/a".into(), human_bytes),
                ])
            })
            .collect();
        let t = Table::new(
            rows,
            [
                Constraint::Min(16),
                Constraint::Length(7),
                Constraint::Length(10),
                Constraint::Length(12),
                Constraint::Length(12),
                Constraint::Length(12),
            ],
        )
        .header(
            Row::new(vec![
                "gpumem pool",
                "device",
                "strategy",
                "reserved",
                "peak",
                "allocated",
            ])
            .bold(),
        )
        .block(Block::bordered().title(" gpumem pools "));
        f.render_widget(t, areas[k]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_interval("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_interval("2").unwrap(), Duration::from_secs(2));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("fast").is_err());
    }

    #[test]
    fn device_selection() {
        assert_eq!(selected("all", 3).unwrap(), vec![0, 1, 2]);
        assert_eq!(selected("cuda:2", 3).unwrap(), vec![2]);
        assert_eq!(selected("cuda", 3).unwrap(), vec![0]);
        assert!(selected("cuda:3", 3).is_err());
        assert!(selected("gpu0", 3).is_err());
        assert!(selected("all", 0).is_err());
    }

    #[test]
    fn pool_stats_files() {
        let dir = std::env::temp_dir().join(format!("gpumem-watch-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("1234.json"),
            r#"{"device":0,"strategy":"paged","reserved_bytes.all.current":4096,"reserved_bytes.all.peak":8192,"allocated_bytes.all.current":1024}"#,
        )
        .unwrap();
        std::fs::write(dir.join("junk.json"), "not json").unwrap();
        let (p, notes) = pools(Some(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            notes,
            [format!(
                "{}: not JSON (line 1, column 2), skipped",
                dir.join("junk.json").display()
            )]
        );
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].source, "1234");
        assert_eq!(p[0].reserved_bytes, Some(4096));
        assert_eq!(p[0].reserved_peak_bytes, Some(8192));
        assert_eq!(p[0].allocated_bytes, Some(1024));
        assert_eq!(p[0].allocated_peak_bytes, None);
        assert_eq!(p[0].strategy.as_deref(), Some("paged"));
    }
}
