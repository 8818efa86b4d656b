//! The parts of hcabench that other crates use too: the cluster description (its TOML
//! file), which the fuzz harness feeds any text.

pub mod config;
