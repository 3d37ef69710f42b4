//! The environment of every program telegate starts (terminal tool
//! commands, background processes, command-backend programs).
//!
//! Children get a minimal environment by default: only the variables in
//! [`DEFAULT_PASSED_ENV`] (and `LC_*`), plus the names a config lists in
//! `pass_env`, plus the values it sets in `env`. Everything else telegate
//! inherited stays behind, so a secret that happens to be in telegate's
//! environment (a cloud key, a database password) never reaches a command
//! the model chose. Secret names ([`ChildEnv::blocked`]) are never passed,
//! whatever `pass_env` says.
//!
//! This module owns that rule. It must never read a secret's value, and
//! never let `pass_env` re-open a blocked name.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;

/// Variables every child gets from telegate's environment when set there.
pub const DEFAULT_PASSED_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
];

/// Which variables a child gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChildEnv {
    /// More names passed from telegate's environment (`pass_env`).
    pub pass: BTreeSet<String>,
    /// Values set for the child (`env`); they win over passed ones (and
    /// over `blocked`: a value written in the config is not inherited).
    pub set: BTreeMap<String, String>,
    /// Names never passed (secrets), even if listed in `pass`.
    pub blocked: BTreeSet<String>,
}

impl ChildEnv {
    /// Whether `name` may pass from telegate's environment to a child.
    pub fn passes(&self, name: &str) -> bool {
        if self.blocked.contains(name) {
            return false;
        }
        DEFAULT_PASSED_ENV.contains(&name) || name.starts_with("LC_") || self.pass.contains(name)
    }

    /// The child's environment, given telegate's (`inherited`).
    pub fn build(
        &self,
        inherited: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Vec<(OsString, OsString)> {
        let mut env: BTreeMap<OsString, OsString> = inherited
            .into_iter()
            .filter(|(name, _)| name.to_str().is_some_and(|name| self.passes(name)))
            .collect();
        // A value written in the config is the operator's choice, not one
        // of telegate's secrets leaking.
        for (name, value) in &self.set {
            env.insert(name.into(), value.into());
        }
        env.into_iter().collect()
    }

    /// Clear `command`'s environment and give it this one.
    pub fn apply(&self, command: &mut tokio::process::Command) {
        command.env_clear();
        command.envs(self.build(std::env::vars_os()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(n, v)| (n.into(), v.into())).collect()
    }

    #[test]
    fn only_the_allowlist_pass_and_secrets_never() {
        let env = ChildEnv {
            pass: BTreeSet::from(["EXTRA".to_string(), "TELEGRAM_BOT_TOKEN".to_string()]),
            set: BTreeMap::from([("SET".to_string(), "1".to_string())]),
            blocked: BTreeSet::from(["TELEGRAM_BOT_TOKEN".to_string()]),
        };
        let built = env.build(os(&[
            ("PATH", "/bin"),
            ("LC_ALL", "C"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("EXTRA", "e"),
            ("TELEGRAM_BOT_TOKEN", "1:T"),
        ]));
        assert_eq!(
            built,
            os(&[
                ("EXTRA", "e"),
                ("LC_ALL", "C"),
                ("PATH", "/bin"),
                ("SET", "1")
            ])
        );
    }
}
