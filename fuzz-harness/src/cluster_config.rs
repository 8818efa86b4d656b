//! The cluster file's parser (`hcabench::config`) fed any text: it never panics, and a
//! description it accepts survives the trip `hcabench up` makes it take (written into the
//! run directory as TOML, read back by later commands) unchanged.

use hcabench::config::ClusterConfig;

/// What the fuzzer decodes its bytes into: the file's text.
pub type Input = String;

/// One run of the target on a decoded input.
pub fn run(text: Input) {
    let Ok(config) = ClusterConfig::parse(&text, "input") else {
        return;
    };
    let written = toml::to_string(&config)
        .unwrap_or_else(|e| panic!("an accepted description does not serialize: {e}"));
    let read = ClusterConfig::parse(&written, "written")
        .unwrap_or_else(|e| panic!("what was written does not parse: {e}\n{written}"));
    assert_eq!(
        read, config,
        "the description changed on its way:\n{written}"
    );
}
