//! `[schedule]`: scheduled jobs and reminders.

use std::time::Duration;

use jiff::tz::TimeZone;
use serde::Deserialize;

use super::run::CatchUp;

/// `[schedule]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// Jobs and the scheduler (on by default).
    #[serde(default = "default_enabled")]
    pub enabled: bool,
    /// The IANA time zone jobs use unless a chat chose one with
    /// `/timezone` (default: the system's).
    #[serde(default)]
    pub timezone: Option<String>,
    /// Runs missed while telegate was not running: `latest` (default),
    /// `none` or `all`.
    #[serde(default)]
    pub catch_up: CatchUp,
    /// Jobs a chat may hold (active or paused).
    #[serde(default = "default_max_jobs_per_chat")]
    pub max_jobs_per_chat: usize,
    /// The shortest time between two runs of a recurring job, like
    /// `"1m"`, `"30s"`, `"1h"`.
    #[serde(default = "default_min_interval")]
    pub min_interval: String,
    /// A job whose runs fail this many times in a row is paused.
    #[serde(default = "default_max_failures")]
    pub max_failures: u32,
}

fn default_enabled() -> bool {
    true
}

fn default_max_jobs_per_chat() -> usize {
    20
}

fn default_min_interval() -> String {
    "1m".to_string()
}

fn default_max_failures() -> u32 {
    3
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            enabled: default_enabled(),
            timezone: None,
            catch_up: CatchUp::default(),
            max_jobs_per_chat: default_max_jobs_per_chat(),
            min_interval: default_min_interval(),
            max_failures: default_max_failures(),
        }
    }
}

impl ScheduleConfig {
    /// Check the table (the zone exists, the numbers make sense).
    pub fn validate(&self) -> Result<(), String> {
        if let Some(zone) = &self.timezone {
            TimeZone::get(zone).map_err(|_| {
                format!(
                    "schedule.timezone {zone:?} is not a known IANA time zone (like \"Europe/Berlin\" or \"UTC\")"
                )
            })?;
        }
        if self.max_jobs_per_chat == 0 || self.max_jobs_per_chat > 10_000 {
            return Err(format!(
                "schedule.max_jobs_per_chat must be between 1 and 10000 (it is {})",
                self.max_jobs_per_chat
            ));
        }
        if self.max_failures == 0 {
            return Err("schedule.max_failures must be at least 1".to_string());
        }
        self.min_interval_duration()?;
        Ok(())
    }

    /// `min_interval` as a duration (at least one second).
    pub fn min_interval_duration(&self) -> Result<Duration, String> {
        let bad = || {
            format!(
                "schedule.min_interval {:?} is not a duration of at least 1s, like \"1m\", \"30s\" or \"1h\"",
                self.min_interval
            )
        };
        let span: jiff::Span = self.min_interval.trim().parse().map_err(|_| bad())?;
        let duration = jiff::SignedDuration::try_from(span).map_err(|_| bad())?;
        let duration = Duration::try_from(duration).map_err(|_| bad())?;
        if duration < Duration::from_secs(1) {
            return Err(bad());
        }
        Ok(duration)
    }

    /// The zone jobs use by default: the configured one, else the
    /// system's (by its IANA name), else UTC (logged: a system zone without
    /// a name cannot be stored with a job).
    pub fn default_zone(&self) -> (String, TimeZone) {
        if let Some(name) = &self.timezone {
            if let Ok(tz) = TimeZone::get(name) {
                return (name.clone(), tz);
            }
        }
        let system = TimeZone::system();
        match system.iana_name() {
            Some(name) => (name.to_string(), system.clone()),
            None => {
                tracing::warn!(
                    "the system time zone has no IANA name; jobs use UTC unless \
                     [schedule] timezone or /timezone names one"
                );
                ("UTC".to_string(), TimeZone::UTC)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_hold_and_bad_values_are_named() {
        let config = ScheduleConfig::default();
        assert!(config.validate().is_ok());
        assert_eq!(config.min_interval_duration(), Ok(Duration::from_secs(60)));
        let zone = ScheduleConfig {
            timezone: Some("Mars/Olympus".into()),
            ..ScheduleConfig::default()
        };
        assert!(zone.validate().unwrap_err().contains("Mars/Olympus"));
        let interval = ScheduleConfig {
            min_interval: "soon".into(),
            ..ScheduleConfig::default()
        };
        assert!(interval.validate().unwrap_err().contains("min_interval"));
        let tiny = ScheduleConfig {
            min_interval: "500ms".into(),
            ..ScheduleConfig::default()
        };
        assert!(tiny.validate().is_err());
        let berlin = ScheduleConfig {
            timezone: Some("Europe/Berlin".into()),
            ..ScheduleConfig::default()
        };
        assert_eq!(berlin.default_zone().0, "Europe/Berlin");
    }
}
