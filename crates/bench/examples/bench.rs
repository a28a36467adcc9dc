//! Runs `tessera bench` without the main command: `cargo run --release -p tessera-bench
//! --example bench -- gemm --shapes smollm --m 1,8`.

use clap::Parser;
use tessera_bench::cli::{run, BenchCommand};

#[derive(Parser)]
#[command(name = "bench")]
struct Args {
    #[command(subcommand)]
    cmd: BenchCommand,
}

fn main() -> anyhow::Result<()> {
    run(Args::parse().cmd)
}
