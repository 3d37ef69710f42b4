//! Several bots' metrics on one `/metrics`: each bot's registry rendered
//! as usual, then merged family by family with a `bot="<name>"` label on
//! every sample, so each metric family appears once (its `# HELP` and
//! `# TYPE` lines once, as the text format requires) with one series per
//! bot.
//!
//! Bot names are checked when the file is read (`A-Z a-z 0-9 _ -`), so the
//! label value needs no escaping. Pure; the registries render themselves.

use std::collections::HashMap;

use crate::metrics::Metrics;

/// Every bot's metrics in the Prometheus text format, labelled by bot.
pub fn render_labelled(bots: &[(String, Metrics)]) -> String {
    let texts: Vec<(&str, String)> = bots
        .iter()
        .map(|(name, metrics)| (name.as_str(), metrics.render_prometheus()))
        .collect();
    merge_labelled(&texts)
}

/// `texts` (each one bot's exposition) as one exposition: families in the
/// order they first appear, each header once, every sample labelled
/// `bot="<name>"`; a final `# EOF` kept once if the inputs had one.
pub(super) fn merge_labelled(texts: &[(&str, String)]) -> String {
    let mut families: Vec<(String, Vec<String>)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut eof = false;
    for (bot, text) in texts {
        let mut current: Option<usize> = None;
        for line in text.lines() {
            if line == "# EOF" {
                eof = true;
                continue;
            }
            if let Some(name) = header_family(line) {
                let at = *index.entry(name.to_string()).or_insert_with(|| {
                    families.push((name.to_string(), Vec::new()));
                    families.len() - 1
                });
                let lines = &mut families[at].1;
                if !lines.iter().any(|known| known == line) {
                    lines.push(line.to_string());
                }
                current = Some(at);
            } else if !line.is_empty() && !line.starts_with('#') {
                let labelled = with_bot_label(line, bot);
                match current {
                    Some(at) => families[at].1.push(labelled),
                    None => families.push((String::new(), vec![labelled])),
                }
            }
        }
    }
    let mut out = String::new();
    for (_, lines) in families {
        for line in lines {
            out.push_str(&line);
            out.push('\n');
        }
    }
    if eof {
        out.push_str("# EOF\n");
    }
    out
}

/// The family a `# HELP`, `# TYPE` or `# UNIT` line describes.
fn header_family(line: &str) -> Option<&str> {
    let rest = line
        .strip_prefix("# HELP ")
        .or_else(|| line.strip_prefix("# TYPE "))
        .or_else(|| line.strip_prefix("# UNIT "))?;
    rest.split(' ').next()
}

/// A sample line with `bot="<name>"` as its first label.
fn with_bot_label(line: &str, bot: &str) -> String {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let (name, rest) = line.split_at(name_end);
    match rest.strip_prefix('{') {
        Some(labels) if labels.starts_with('}') => format!("{name}{{bot=\"{bot}\"{labels}"),
        Some(labels) => format!("{name}{{bot=\"{bot}\",{labels}"),
        None => format!("{name}{{bot=\"{bot}\"}}{rest}"),
    }
}

#[cfg(test)]
mod tests {
    use super::{merge_labelled, with_bot_label};

    #[test]
    fn samples_get_the_bot_label_first() {
        assert_eq!(with_bot_label("a_total 3", "x"), "a_total{bot=\"x\"} 3");
        assert_eq!(
            with_bot_label("a{state=\"ok\"} 3", "x"),
            "a{bot=\"x\",state=\"ok\"} 3"
        );
        assert_eq!(with_bot_label("a{} 3", "x"), "a{bot=\"x\"} 3");
    }

    #[test]
    fn each_family_appears_once_with_a_series_per_bot() {
        let one = "# HELP t Turns.\n# TYPE t counter\nt_total 1\n# HELP q Queue.\n# TYPE q gauge\nq 0\n# EOF\n";
        let two = "# HELP t Turns.\n# TYPE t counter\nt_total 5\n# HELP q Queue.\n# TYPE q gauge\nq 2\n# EOF\n";
        let merged = merge_labelled(&[("a", one.to_string()), ("b", two.to_string())]);
        assert_eq!(
            merged,
            "# HELP t Turns.\n# TYPE t counter\nt_total{bot=\"a\"} 1\nt_total{bot=\"b\"} 5\n\
             # HELP q Queue.\n# TYPE q gauge\nq{bot=\"a\"} 0\nq{bot=\"b\"} 2\n# EOF\n"
        );
    }

    #[test]
    fn the_real_registry_merges_into_one_family_per_metric() {
        let metrics = crate::metrics::Metrics::new();
        metrics.turns_started.inc();
        let merged = super::render_labelled(&[
            ("a".to_string(), metrics.clone()),
            ("b".to_string(), crate::metrics::Metrics::new()),
        ]);
        assert_eq!(
            merged
                .matches("# TYPE telegate_turns_started_total ")
                .count(),
            1,
            "{merged}"
        );
        assert!(
            merged.contains("telegate_turns_started_total{bot=\"a\"} 1"),
            "{merged}"
        );
        assert!(
            merged.contains("telegate_turns_started_total{bot=\"b\"} 0"),
            "{merged}"
        );
    }
}
