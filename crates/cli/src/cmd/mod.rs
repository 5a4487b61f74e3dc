//! One module per subcommand, each with its clap `Args` and a `run` function.

pub mod inspect;
