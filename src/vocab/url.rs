//! The rule every settings table applies to a URL it calls: http(s) with
//! a host (pure; shared by the config loader and the layers whose settings
//! carry URLs, so none of them reaches up to the loader for it).

/// `value` (the setting `key`) must be an http(s) URL with a host; the
/// error names the key and says what is wrong.
pub fn check_http_url(key: &str, value: &str) -> Result<(), String> {
    let url = url::Url::parse(value).map_err(|e| format!("{key} {value:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{key} {value:?} must be an http:// or https:// URL"
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{key} {value:?} has no host"));
    }
    Ok(())
}
