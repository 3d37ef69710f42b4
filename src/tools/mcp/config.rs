//! `[[tools.mcp]]`: one MCP server whose tools the openai backend offers
//! the model, and the checks of its values (pure, except that
//! `header_files` are read once at load, like every other secret file).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::secrets::Secret;

/// Which calls of a server's tools need the user's approval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum McpApproval {
    /// Calls of tools that may change something: every tool unless the
    /// server marks it read-only (`readOnlyHint`) or not destructive
    /// (`destructiveHint = false`). The MCP default for an unmarked tool
    /// is "may be destructive", so an unmarked tool asks.
    #[default]
    Dangerous,
    /// Every call.
    Always,
    /// No call (the model runs anything the server offers).
    Never,
}

/// One `[[tools.mcp]]` table.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The server's name: its tools reach the model as `<name>__<tool>`.
    /// Letters, digits and `-`, at most 32 characters.
    pub name: String,
    /// A stdio server: the program to start (a path, or a name looked up
    /// in `PATH`). Exactly one of `command` and `url`.
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments (no shell).
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables set for it.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables passed from telegate's environment besides the minimal
    /// set every child gets (secrets never pass).
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// Its working directory (default: telegate's).
    #[serde(default)]
    pub workdir: Option<PathBuf>,
    /// A streamable HTTP server: its endpoint (`http://` or `https://`).
    #[serde(default)]
    pub url: Option<String>,
    /// HTTP headers sent with every request (not secrets: they show in
    /// the config).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// HTTP headers whose values are secrets: header name → a file whose
    /// whole content (trimmed, at most 4 KiB) is the value, e.g.
    /// `{ Authorization = "/run/secrets/mcp-token" }` holding
    /// `Bearer …`. Read once at load.
    #[serde(default)]
    pub header_files: BTreeMap<String, PathBuf>,
    /// Offer only these tools (the server's own names); empty: all.
    #[serde(default)]
    pub allowed_tools: Vec<String>,
    /// `"dangerous"` (default), `"always"` or `"never"`.
    #[serde(default)]
    pub approval: McpApproval,
    /// The longest one call may take, in seconds.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u64,
    /// The longest starting (or restarting) the server and listing its
    /// tools may take, in seconds.
    #[serde(default = "default_startup_timeout_secs")]
    pub startup_timeout_secs: u64,
    /// A result longer than this many bytes is cut (with a note saying so)
    /// before it reaches the model.
    #[serde(default = "default_result_cap_bytes")]
    pub result_cap_bytes: usize,
    /// The values of `header_files`, read at load.
    #[serde(skip)]
    pub resolved_headers: Vec<(String, Secret)>,
}

fn default_timeout_secs() -> u64 {
    120
}
fn default_startup_timeout_secs() -> u64 {
    30
}
fn default_result_cap_bytes() -> usize {
    32 * 1024
}

/// The most servers one configuration may name.
pub const MAX_SERVERS: usize = 32;

impl McpServerConfig {
    /// The longest one call may take.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    /// The longest a start may take.
    pub fn startup_timeout(&self) -> Duration {
        Duration::from_secs(self.startup_timeout_secs)
    }

    /// Check the values; the error is one line naming the key
    /// (`tools.mcp[i].…`, `i` from 0).
    pub fn validate(&self, index: usize) -> Result<(), String> {
        self.check_name(index)?;
        self.check_transport(index)?;
        self.check_env_and_headers(index)?;
        self.check_workdir_and_bounds(index)
    }

    /// `name`: 1 to 32 letters, digits or '-'.
    fn check_name(&self, index: usize) -> Result<(), String> {
        if self.name.is_empty()
            || self.name.len() > 32
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(format!(
                "{} = {:?}: use 1 to 32 letters, digits or '-' (tools reach the model as <name>__<tool>)",
                key(index, "name"),
                self.name
            ));
        }
        Ok(())
    }

    /// Either `command` (and nothing only a url server takes) or `url`
    /// (and nothing only a command server takes).
    fn check_transport(&self, index: usize) -> Result<(), String> {
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "tools.mcp[{index}] ({}) has both command and url: a server is either started (command) or reached over HTTP (url)",
                    self.name
                ))
            }
            (None, None) => {
                return Err(format!(
                    "tools.mcp[{index}] ({}) needs command (a stdio server) or url (streamable HTTP)",
                    self.name
                ))
            }
            (Some(command), None) => {
                if command.trim().is_empty() || command.contains('\0') {
                    return Err(format!("{} is empty", key(index, "command")));
                }
                if !self.headers.is_empty() || !self.header_files.is_empty() {
                    return Err(format!(
                        "tools.mcp[{index}] ({}): headers and header_files are for url servers",
                        self.name
                    ));
                }
            }
            (None, Some(url)) => {
                crate::vocab::check_http_url(&key(index, "url"), url)?;
                if !self.args.is_empty()
                    || !self.env.is_empty()
                    || !self.pass_env.is_empty()
                    || self.workdir.is_some()
                {
                    return Err(format!(
                        "tools.mcp[{index}] ({}): args, env, pass_env and workdir are for command servers",
                        self.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// `env` names and values, header names and values.
    fn check_env_and_headers(&self, index: usize) -> Result<(), String> {
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
                return Err(format!(
                    "{}: {name:?} is not a valid variable (empty, '=' or a NUL byte)",
                    key(index, "env")
                ));
            }
        }
        for name in self.headers.keys().chain(self.header_files.keys()) {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(format!(
                    "{}: {name:?} is not a header name",
                    key(index, "headers")
                ));
            }
        }
        for (name, value) in &self.headers {
            if http::HeaderValue::from_str(value).is_err() {
                return Err(format!(
                    "{}: the value of {name:?} is not a valid header value",
                    key(index, "headers")
                ));
            }
        }
        Ok(())
    }

    /// `workdir` a directory; timeouts, the result cap and tool names
    /// within their bounds.
    fn check_workdir_and_bounds(&self, index: usize) -> Result<(), String> {
        if let Some(dir) = &self.workdir {
            if !dir.is_dir() {
                return Err(format!(
                    "{} {} is not a directory",
                    key(index, "workdir"),
                    dir.display()
                ));
            }
        }
        for (name, value) in [
            ("timeout_secs", self.timeout_secs),
            ("startup_timeout_secs", self.startup_timeout_secs),
        ] {
            if !(1..=86_400).contains(&value) {
                return Err(format!("{} must be between 1 and 86400", key(index, name)));
            }
        }
        if !(256..=1024 * 1024).contains(&self.result_cap_bytes) {
            return Err(format!(
                "{} must be between 256 and 1048576",
                key(index, "result_cap_bytes")
            ));
        }
        if self.allowed_tools.iter().any(|t| t.trim().is_empty()) {
            return Err(format!("{} has an empty name", key(index, "allowed_tools")));
        }
        Ok(())
    }

    /// Read `header_files` (at load, before the environment is scrubbed).
    pub fn resolve_headers(&mut self, index: usize) -> Result<(), String> {
        let mut resolved = Vec::new();
        for (name, path) in &self.header_files {
            let key = format!("tools.mcp[{index}].header_files.{name}");
            let value = crate::secrets::read_secret_file(&key, path)?;
            if http::HeaderValue::from_str(value.expose()).is_err() {
                return Err(format!(
                    "{key}: {} does not hold a valid header value",
                    path.display()
                ));
            }
            resolved.push((name.clone(), value));
        }
        self.resolved_headers = resolved;
        Ok(())
    }
}

/// The key of setting `name` of server `index` (`tools.mcp[i].name`).
fn key(index: usize, name: &str) -> String {
    format!("tools.mcp[{index}].{name}")
}

/// Check every server and that their names differ.
pub fn validate_all(servers: &[McpServerConfig]) -> Result<(), String> {
    if servers.len() > MAX_SERVERS {
        return Err(format!(
            "tools.mcp names {} servers; at most {MAX_SERVERS}",
            servers.len()
        ));
    }
    for (index, server) in servers.iter().enumerate() {
        server.validate(index)?;
        if servers[..index].iter().any(|s| s.name == server.name) {
            return Err(format!(
                "tools.mcp[{index}].name {:?} is used twice",
                server.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(text: &str) -> McpServerConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn defaults_and_the_two_kinds() {
        let stdio = server("name = \"fs\"\ncommand = \"mcp-fs\"\nargs = [\"/srv\"]");
        assert_eq!(stdio.approval, McpApproval::Dangerous);
        assert_eq!(stdio.timeout_secs, 120);
        assert_eq!(stdio.result_cap_bytes, 32 * 1024);
        assert!(stdio.validate(0).is_ok());
        let http = server("name = \"web\"\nurl = \"https://mcp.example.com/mcp\"\nheaders = { X-Team = \"a\" }\napproval = \"always\"");
        assert!(http.validate(0).is_ok());
        assert!(toml::from_str::<McpServerConfig>("name = \"x\"\ncomand = \"y\"").is_err());
        assert!(toml::from_str::<McpServerConfig>("name = \"x\"\napproval = \"maybe\"").is_err());
    }

    #[test]
    fn bad_values_name_their_key() {
        let bad = |text: &str| server(text).validate(3).unwrap_err();
        assert!(bad("name = \"a__b\"\ncommand = \"x\"").contains("tools.mcp[3].name"));
        assert!(bad("name = \"a\"").contains("needs command"));
        assert!(bad("name = \"a\"\ncommand = \"x\"\nurl = \"http://h\"").contains("both"));
        assert!(bad("name = \"a\"\nurl = \"ftp://h\"").contains("tools.mcp[3].url"));
        assert!(bad("name = \"a\"\nurl = \"http://h\"\nargs = [\"x\"]").contains("command servers"));
        assert!(
            bad("name = \"a\"\ncommand = \"x\"\nheaders = { A = \"b\" }").contains("url servers")
        );
        assert!(
            bad("name = \"a\"\nurl = \"http://h\"\nheaders = { \"A B\" = \"b\" }")
                .contains("not a header name")
        );
        assert!(bad("name = \"a\"\ncommand = \"x\"\ntimeout_secs = 0").contains("timeout_secs"));
        assert!(bad("name = \"a\"\ncommand = \"x\"\nresult_cap_bytes = 10")
            .contains("result_cap_bytes"));
        let twice = [
            server("name = \"a\"\ncommand = \"x\""),
            server("name = \"a\"\ncommand = \"y\""),
        ];
        assert!(validate_all(&twice).unwrap_err().contains("used twice"));
    }

    #[test]
    fn every_key_the_example_shows_is_a_real_key() {
        let example = crate::config::zero_config::EXAMPLE_CONFIG;
        let start = example
            .find("# [[tools.mcp]]")
            .expect("the example documents [[tools.mcp]]");
        let block = &example[start..];
        let block = &block[..block.find("\n[").unwrap_or(block.len())];
        let keys: Vec<&str> = block
            .lines()
            .filter_map(|l| l.strip_prefix("# "))
            .filter(|l| {
                l.split(" = ").next().is_some_and(|k| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                }) && l.contains(" = ")
            })
            .collect();
        let text = keys.join("\n");
        let config: McpServerConfig =
            toml::from_str(&text).expect("every key of the example parses");
        for key in [
            "name",
            "command",
            "args",
            "env",
            "pass_env",
            "workdir",
            "url",
            "headers",
            "header_files",
            "allowed_tools",
            "approval",
            "timeout_secs",
            "startup_timeout_secs",
            "result_cap_bytes",
        ] {
            assert!(
                keys.iter().any(|l| l.starts_with(&format!("{key} = "))),
                "{key} is documented"
            );
        }
        assert_eq!(config.name, "fs");
    }

    #[test]
    fn the_whole_config_checks_mcp_servers_and_permission_prompts() {
        use crate::config::{Config, Purpose};
        let parse = |body: &str| {
            Config::parse(
                std::path::Path::new("t.toml"),
                body,
                Purpose::Console,
                |_| None,
            )
            .map(|c| c.summary())
            .map_err(|e| e.to_string())
        };
        let openai = "[agent]\nbackend = \"openai\"\n[agent.openai]\nmodel = \"m\"\n[store]\nin_memory = true\n";
        let summary = parse(&format!(
            "{openai}[[tools.mcp]]\nname = \"fs\"\ncommand = \"x\"\n"
        ))
        .unwrap();
        assert!(summary.contains("MCP servers: fs"), "{summary}");
        let echo = "[agent]\nbackend = \"echo\"\n[store]\nin_memory = true\n[[tools.mcp]]\nname = \"fs\"\ncommand = \"x\"\n";
        assert!(parse(echo)
            .unwrap_err()
            .contains("needs agent.backend = \"openai\""));
        let bad = format!("{openai}[[tools.mcp]]\nname = \"fs\"\ncommand = \"x\"\npass_env = [\"TELEGRAM_BOT_TOKEN\"]\n");
        assert!(parse(&bad).unwrap_err().contains("tools.mcp[0].pass_env"));
        let codex = "[agent]\nbackend = \"command\"\n[agent.command]\npreset = \"codex\"\npermission_prompt = true\n[store]\nin_memory = true\n";
        assert!(parse(codex)
            .unwrap_err()
            .contains("permission_prompt only applies"));
        let claude = codex.replace("codex", "claude");
        assert!(parse(&claude).is_ok());
    }

    #[test]
    fn header_files_are_read_as_secrets() {
        let dir = std::env::temp_dir().join(format!("telegate-mcp-headers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("auth");
        std::fs::write(&file, "Bearer sk-abc\n").unwrap();
        let mut config = server(&format!(
            "name = \"a\"\nurl = \"http://h\"\nheader_files = {{ Authorization = {:?} }}",
            file.display().to_string()
        ));
        config.resolve_headers(0).unwrap();
        assert_eq!(config.resolved_headers.len(), 1);
        assert_eq!(config.resolved_headers[0].1.expose(), "Bearer sk-abc");
        std::fs::write(&file, "").unwrap();
        assert!(config.resolve_headers(0).unwrap_err().contains("empty"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
