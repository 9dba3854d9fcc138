//! The `gpumem` command-line tool.
use clap::{Parser, Subcommand};

mod cmd_advise;
mod cmd_analyze;
mod cmd_bench;
mod cmd_convert;
mod cmd_info;
mod cmd_inspect;
mod cmd_map;
mod cmd_replay;
mod cmd_report;
mod cmd_tune;
mod cmd_vmm;
mod cmd_watch;
mod output;
mod progress;
mod trace_args;
mod units;

/// GPU memory toolkit: replay allocation traces through allocators, inspect and benchmark
/// device and pinned host memory.
#[derive(Parser)]
#[command(name = "gpumem", version, about, long_about = None)]
struct Cli {
    /// Say more on failure (e.g. every library file searched for the CUDA driver).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay an allocation trace through allocators and report reserved memory and fragmentation.
    Replay(cmd_replay::ReplayArgs),
    /// Rank PYTORCH_CUDA_ALLOC_CONF settings by the memory a trace needs under each, with gpumem's own plug-in settings (GPUMEM_CONF) beside them.
    Tune(cmd_tune::TuneArgs),
    /// One self-contained HTML page: timelines, memory maps, what holds memory at the peak.
    Report(cmd_report::ReportArgs),
    /// The memory map of one allocator at one event, in the terminal.
    Map(cmd_map::MapArgs),
    /// A live view of each GPU's memory (NVML), or one sample with --once.
    Watch(cmd_watch::WatchArgs),
    /// Devices, memory, granularity and pool figures (the simulated device without a CUDA driver).
    Info(cmd_info::InfoArgs),
    /// Allocate blocks and show each pointer as the driver and the pool see it (needs CUDA, or --device sim).
    Inspect(cmd_inspect::InspectArgs),
    /// Print the page table of a live VMM arena (needs CUDA, or --device sim).
    Vmm(cmd_vmm::VmmArgs),
    /// Benchmarks: device allocation, host<->device transfers, pinned allocation.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Convert a trace (PyTorch snapshot, RMM log) to gpumem JSON lines.
    Convert(cmd_convert::ConvertArgs),
    /// Recommend pageable, pinned, staged or mapped memory for a transfer pattern.
    Advise(cmd_advise::AdviseArgs),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Alloc+free latency and throughput of each strategy against cuMemAlloc and cuMemAllocAsync.
    Alloc(cmd_bench::alloc::BenchAllocArgs),
    /// Host<->device bandwidth for pageable, pinned, write-combined, mapped and staged memory.
    Transfer(cmd_bench::transfer::BenchTransferArgs),
    /// Allocation latency of pinned host memory: cuMemHostAlloc, cuMemHostRegister, malloc, pool.
    Pinned(cmd_bench::pinned::BenchPinnedArgs),
}

/// A reader that closes the pipe early (`gpumem replay T | head -1`) makes `println!` panic
/// with "failed printing to stdout: Broken pipe": end quietly instead, as Unix tools do on
/// SIGPIPE. Any other failure to print (a full disk, `> /dev/full`) is an error of one line
/// and exit status 1, not a panic with a backtrace; every other panic goes to the default
/// hook.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if let Some(why) = msg.strip_prefix("failed printing to stdout: ") {
            if why.contains("Broken pipe") {
                std::process::exit(0);
            }
            eprintln!("error: writing to standard output: {why}");
            std::process::exit(1);
        }
        default(info);
    }));
}

fn main() {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let verbose = cli.verbose;
    let result = match cli.command {
        Command::Replay(a) => cmd_replay::run(a),
        Command::Tune(a) => cmd_tune::run(a),
        Command::Report(a) => cmd_report::run(a),
        Command::Map(a) => cmd_map::run(a),
        Command::Watch(a) => cmd_watch::run(a),
        Command::Info(a) => cmd_info::info(a),
        Command::Inspect(a) => cmd_inspect::inspect(a),
        Command::Vmm(a) => cmd_vmm::vmm(a),
        Command::Bench(BenchCommand::Alloc(a)) => cmd_bench::alloc::bench_alloc(a),
        Command::Bench(BenchCommand::Transfer(a)) => cmd_bench::transfer::bench_transfer(a),
        Command::Bench(BenchCommand::Pinned(a)) => cmd_bench::pinned::bench_pinned(a),
        Command::Advise(a) => cmd_advise::advise(a),
        Command::Convert(a) => cmd_convert::run(a),
    };
    if let Err(e) = result {
        // A reader closing the pipe (`gpumem convert T | head`) is not an error.
        if e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        }) {
            return;
        }
        eprintln!("error: {}", error_text(&e));
        if let Some(searched) = no_driver_search(&e) {
            if verbose {
                eprintln!("searched for the driver: {}", searched.join(", "));
            } else if !searched.is_empty() {
                eprintln!("(-v lists the {} library names searched)", searched.len());
            }
        }
        std::process::exit(1);
    }
}

/// The library names searched for the CUDA driver, when `e` is (or wraps) a missing driver.
fn no_driver_search(e: &anyhow::Error) -> Option<&[String]> {
    e.chain()
        .find_map(|c| match c.downcast_ref::<gpumem::cuda::CudaError>() {
            Some(gpumem::cuda::CudaError::NoDriver { searched }) => Some(searched.as_slice()),
            _ => None,
        })
}

/// The error and its causes, each cause printed once: library errors often already include
/// their source in their own message.
fn error_text(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}
