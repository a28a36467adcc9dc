//! Argument parsing of `tessera bench`.

use super::*;
use clap::Parser;

use crate::serve::Endpoint;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: BenchCommand,
}

#[test]
fn gemm_defaults_and_lists() {
    let c = Cli::parse_from(["x", "gemm"]);
    match c.cmd {
        BenchCommand::Gemm {
            precision,
            dtypes,
            shapes,
            m,
            candidates,
            plot,
            ..
        } => {
            assert_eq!(precision, PrecisionArg::Exact);
            assert_eq!(dtypes, vec!["f32", "q4_1", "q8_0"]);
            assert_eq!(shapes, vec!["smollm", "llama7b"]);
            assert_eq!(m, None);
            assert_eq!(candidates, 8);
            assert_eq!(plot, None);
        }
        _ => panic!("not gemm"),
    }
    let c = Cli::parse_from(["x", "gemm", "--m", "1,8", "--dtypes", "q4_1", "--plot"]);
    match c.cmd {
        BenchCommand::Gemm {
            m, dtypes, plot, ..
        } => {
            assert_eq!(m, Some(vec![1, 8]));
            assert_eq!(dtypes, vec!["q4_1"]);
            assert_eq!(plot, Some(PathBuf::from("bench-gemm.svg")));
        }
        _ => panic!("not gemm"),
    }
}

#[test]
fn model_defaults() {
    let c = Cli::parse_from(["x", "model", "--precision", "fast"]);
    match c.cmd {
        BenchCommand::Model {
            prompt_tokens,
            gen_tokens,
            reps,
            precision,
            ..
        } => {
            assert_eq!((prompt_tokens, gen_tokens, reps), (512, 128, 3));
            assert_eq!(precision, PrecisionArg::Fast);
        }
        _ => panic!("not model"),
    }
}

#[test]
fn serve_defaults_and_modes() {
    let c = Cli::parse_from(["x", "serve", "--url", "http://h:1"]);
    match c.cmd {
        BenchCommand::Serve(ServeArgs {
            endpoint,
            concurrency,
            rate,
            requests,
            prompt_tokens,
            output_tokens,
            temperature,
            slo_ttft_ms,
            slo_tpot_ms,
            response_format,
            ..
        }) => {
            assert_eq!(endpoint, [Endpoint::Completions]);
            assert_eq!(response_format, None);
            assert_eq!((concurrency, rate, requests), (None, None, None));
            assert_eq!((prompt_tokens, output_tokens), (100, 64));
            assert_eq!(
                (temperature, slo_ttft_ms, slo_tpot_ms),
                (0.0, 1000.0, 100.0)
            );
        }
        _ => panic!("not serve"),
    }
    let c = Cli::parse_from([
        "x",
        "serve",
        "--url",
        "u",
        "--sweep",
        "1,2,4",
        "--endpoint",
        "chat",
        "--plot",
        "--response-format",
        "docs/bench/schemas/person.json",
    ]);
    match c.cmd {
        BenchCommand::Serve(ServeArgs {
            sweep,
            endpoint,
            plot,
            response_format,
            ..
        }) => {
            assert_eq!(sweep, Some(vec![1, 2, 4]));
            assert_eq!(
                response_format,
                Some(PathBuf::from("docs/bench/schemas/person.json"))
            );
            assert_eq!(endpoint, [Endpoint::Chat]);
            assert_eq!(plot, Some(PathBuf::from("bench-serve.svg")));
        }
        _ => panic!("not serve"),
    }
    // --api takes a list (--endpoint is its older name), and --rounds.
    let c = Cli::parse_from([
        "x",
        "serve",
        "--url",
        "u",
        "--api",
        "chat,responses,messages",
        "--rounds",
        "3",
    ]);
    match c.cmd {
        BenchCommand::Serve(ServeArgs {
            endpoint, rounds, ..
        }) => {
            assert_eq!(
                endpoint,
                [Endpoint::Chat, Endpoint::Responses, Endpoint::Messages]
            );
            assert_eq!(rounds, 3);
        }
        _ => panic!("not serve"),
    }
    assert!(Cli::try_parse_from(["x", "serve", "--url", "u", "--api", "grpc"]).is_err());
    assert!(
        Cli::try_parse_from(["x", "serve", "--url", "u", "--sweep", "1", "--rate", "2"]).is_err()
    );
    assert!(Cli::try_parse_from([
        "x",
        "serve",
        "--url",
        "u",
        "--sweep",
        "1",
        "--concurrency",
        "2"
    ])
    .is_err());
    assert!(Cli::try_parse_from([
        "x",
        "serve",
        "--url",
        "u",
        "--rate",
        "2",
        "--concurrency",
        "4"
    ])
    .is_ok());
}

#[test]
fn serve_adapters_and_lora_tools() {
    let c = Cli::parse_from(["x", "serve", "--url", "u"]);
    match c.cmd {
        BenchCommand::Serve(ServeArgs { adapters, .. }) => assert_eq!(adapters, None),
        _ => panic!("not serve"),
    }
    let c = Cli::parse_from(["x", "serve", "--url", "u", "--adapters", "base,a0,a1"]);
    match c.cmd {
        BenchCommand::Serve(ServeArgs { adapters, .. }) => {
            assert_eq!(
                adapters,
                Some(vec!["base".into(), "a0".into(), "a1".into()])
            )
        }
        _ => panic!("not serve"),
    }
    assert!(Cli::try_parse_from([
        "x",
        "serve",
        "--url",
        "u",
        "--adapters",
        "a0",
        "--model",
        "m"
    ])
    .is_err());
    let c = Cli::parse_from(["x", "make-adapters", "--out", "/tmp/a"]);
    match c.cmd {
        BenchCommand::MakeAdapters {
            out,
            count,
            rank,
            targets,
            seed,
            model,
            dtype,
        } => {
            assert_eq!(out, PathBuf::from("/tmp/a"));
            assert_eq!((count, rank, seed), (1, 8, 42));
            assert_eq!(targets, vec!["q", "v"]);
            assert_eq!(model, None);
            assert_eq!(dtype, crate::make_adapters::FactorDtype::Bf16);
        }
        _ => panic!("not make-adapters"),
    }
    let c = Cli::parse_from([
        "x",
        "make-adapters",
        "--out",
        "d",
        "--count",
        "16",
        "--rank",
        "16",
        "--targets",
        "all",
        "--dtype",
        "f16",
    ]);
    match c.cmd {
        BenchCommand::MakeAdapters {
            count,
            rank,
            targets,
            dtype,
            ..
        } => {
            assert_eq!((count, rank, targets), (16, 16, vec!["all".to_string()]));
            assert_eq!(dtype, crate::make_adapters::FactorDtype::F16);
        }
        _ => panic!("not make-adapters"),
    }
    assert!(Cli::try_parse_from(["x", "make-adapters"]).is_err());
    let c = Cli::parse_from(["x", "plot-lora", "r.jsonl", "--out", "l.svg"]);
    match c.cmd {
        BenchCommand::PlotLora { file, out } => {
            assert_eq!(file, PathBuf::from("r.jsonl"));
            assert_eq!(out, Some(PathBuf::from("l.svg")));
        }
        _ => panic!("not plot-lora"),
    }
}

#[test]
fn serve_long_prefill_scenario_flags() {
    let c = Cli::parse_from(["x", "serve", "--url", "u"]);
    match c.cmd {
        BenchCommand::Serve(ServeArgs {
            scenario,
            long_prompts,
            long_prompt_tokens,
            short_prompt_tokens,
            short_output_tokens,
            ..
        }) => {
            assert_eq!(scenario, crate::serve::Scenario::Load);
            assert_eq!(
                (long_prompts, long_prompt_tokens, short_prompt_tokens),
                (3, 3600, 30)
            );
            assert_eq!(short_output_tokens, 4);
        }
        _ => panic!("not serve"),
    }
    let c = Cli::parse_from([
        "x",
        "serve",
        "--url",
        "u",
        "--scenario",
        "long-prefill",
        "--long-prompts",
        "2",
        "--short-gap-ms",
        "250",
    ]);
    match c.cmd {
        BenchCommand::Serve(ServeArgs {
            scenario,
            long_prompts,
            short_gap_ms,
            ..
        }) => {
            assert_eq!(scenario, crate::serve::Scenario::LongPrefill);
            assert_eq!((long_prompts, short_gap_ms), (2, 250.0));
        }
        _ => panic!("not serve"),
    }
}
