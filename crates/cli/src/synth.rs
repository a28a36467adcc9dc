//! `tessera synth`: seeded synthetic GGUF files at real models' shapes, with a real
//! tokenizer, for checks where the model files cannot travel (the GPU device check).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;

#[derive(Subcommand)]
pub(crate) enum SynthCommand {
    /// Write the `tokenizer.*` metadata of a GGUF file as a GGUF file with no tensors (a few
    /// MB: the real tokenizer travels where the model cannot).
    Header {
        #[arg(long)]
        from: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a seeded random model of a real model's shape with the tokenizer of a header.
    Model {
        /// smollm2-135m, qwen2.5-0.5b or llama-256 (whole 256-weight rows everywhere).
        #[arg(long)]
        shape: String,
        /// Format of the matrices (rows not on whole blocks of it fall back to q8_0).
        #[arg(long)]
        dtype: String,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// A GGUF file whose tokenizer is copied (`tessera synth header`, or any model).
        #[arg(long)]
        tokenizer: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
}

pub(crate) fn synth(cmd: SynthCommand) -> Result<()> {
    use tessera_formats::gguf::{synthetic, GgufFile};
    let open = |p: &PathBuf| GgufFile::open(p).with_context(|| format!("reading {}", p.display()));
    let (bytes, out) = match cmd {
        SynthCommand::Header { from, out } => {
            (synthetic::tokenizer_header(&open(&from)?.metadata)?, out)
        }
        SynthCommand::Model {
            shape,
            dtype,
            seed,
            tokenizer,
            out,
        } => {
            let shape = synthetic::shape(&shape)?;
            let dt =
                tessera_core::DType::parse(&dtype).with_context(|| format!("--dtype {dtype:?}"))?;
            let tok = open(&tokenizer)?;
            (
                synthetic::synthetic_gguf(shape, dt, seed, &tok.metadata)?,
                out,
            )
        }
    };
    std::fs::write(&out, &bytes).with_context(|| format!("writing {}", out.display()))?;
    eprintln!(
        "wrote {} ({:.1} MB)",
        out.display(),
        bytes.len() as f64 / 1e6
    );
    Ok(())
}
