//! The endpoint and region of the selected profile of `~/.aws/config`.
//!
//! Why: OpenDAL's signer reads credentials from the AWS files, but not the
//! endpoint, so a profile written for a MinIO, Ceph or versitygw server
//! (`endpoint_url = http://...`, which the AWS CLI and SDKs honour) sent
//! us to AWS instead, and the start-up check failed far from the cause.
//! Precedence is AWS's own ("Service-specific endpoints" in the AWS SDKs
//! and Tools reference): the flag, then `AWS_ENDPOINT_URL_S3`, then
//! `AWS_ENDPOINT_URL`, then the profile's `services` section's `s3`
//! `endpoint_url`, then the profile's `endpoint_url`; the environment and
//! the file are both skipped under `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`.
//! The region likewise: the flag, `AWS_REGION`, `AWS_DEFAULT_REGION`, the
//! profile's `region`.
//!
//! The file is INI as the AWS tools write it: `[default]`, `[profile
//! NAME]` and `[services NAME]` sections, `key = value` lines, and nested
//! settings as indented lines under a key with no value (`s3 =` then
//! `  endpoint_url = ...`). Read once at start; a file that cannot be read
//! is as if absent (the AWS tools do the same).

use std::collections::HashMap;
use std::path::PathBuf;

/// The settings of one section: plain keys, and nested ones as
/// "parent.key" ("s3.endpoint_url").
type Section = HashMap<String, String>;

/// Parses the config file's text into its sections by name ("default",
/// "profile dev", "services local").
fn parse(text: &str) -> HashMap<String, Section> {
    let mut sections: HashMap<String, Section> = HashMap::new();
    let mut current: Option<String> = None;
    let mut parent: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if let Some(name) = trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            sections.entry(name.clone()).or_default();
            current = Some(name);
            parent = None;
            continue;
        }
        let (Some(section), Some((key, value))) = (current.as_ref(), trimmed.split_once('='))
        else {
            continue;
        };
        let (key, value) = (key.trim().to_string(), value.trim().to_string());
        let indented = line.starts_with([' ', '\t']);
        let entries = sections.entry(section.clone()).or_default();
        match (&parent, indented) {
            (Some(p), true) => {
                entries.insert(format!("{p}.{key}"), value);
            }
            _ if value.is_empty() => parent = Some(key),
            _ => {
                parent = None;
                entries.insert(key, value);
            }
        }
    }
    sections
}

/// What the selected profile says (see the module comment).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct ProfileSettings {
    /// `s3`'s `endpoint_url` in the profile's `services` section, else
    /// the profile's `endpoint_url`.
    pub(super) endpoint_url: Option<String>,
    pub(super) region: Option<String>,
}

/// The settings of `profile` ("default" when None) in the config text.
fn profile_settings(text: &str, profile: Option<&str>) -> ProfileSettings {
    let sections = parse(text);
    let name = match profile {
        None | Some("default") => "default".to_string(),
        Some(p) => format!("profile {p}"),
    };
    let Some(section) = sections.get(&name) else {
        return ProfileSettings::default();
    };
    let from_services = section
        .get("services")
        .and_then(|s| sections.get(&format!("services {s}")))
        .and_then(|s| s.get("s3.endpoint_url"))
        .cloned();
    ProfileSettings {
        endpoint_url: from_services
            .or_else(|| section.get("endpoint_url").cloned())
            .filter(|v| !v.is_empty()),
        region: section.get("region").cloned().filter(|v| !v.is_empty()),
    }
}

/// The config file: `AWS_CONFIG_FILE`, else `$HOME/.aws/config`.
fn config_path(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(path) = env("AWS_CONFIG_FILE") {
        let path = match (path.strip_prefix("~/"), env("HOME")) {
            (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
            _ => PathBuf::from(path),
        };
        return Some(path);
    }
    env("HOME").map(|home| PathBuf::from(home).join(".aws/config"))
}

/// The selected profile's settings (`AWS_PROFILE`, else default), from the
/// config file; empty when there is no file or it cannot be read.
pub(super) fn selected_profile(env: &dyn Fn(&str) -> Option<String>) -> ProfileSettings {
    let Some(text) = config_path(env).and_then(|p| std::fs::read_to_string(p).ok()) else {
        return ProfileSettings::default();
    };
    profile_settings(&text, env("AWS_PROFILE").as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "\
# comment
[default]
region = eu-west-1
endpoint_url = http://default:9000

[profile dev]
region=us-west-2
endpoint_url = http://dev:9000
services = local

[services local]
s3 =
  endpoint_url = http://local-s3:7070
sts =
  endpoint_url = http://local-sts:7070

[profile bare]
output = json
";

    #[test]
    fn the_profile_and_its_services_section_are_read() {
        assert_eq!(
            profile_settings(CONFIG, None),
            ProfileSettings {
                endpoint_url: Some("http://default:9000".into()),
                region: Some("eu-west-1".into()),
            }
        );
        // The services section's s3 endpoint wins over the profile's own.
        assert_eq!(
            profile_settings(CONFIG, Some("dev")),
            ProfileSettings {
                endpoint_url: Some("http://local-s3:7070".into()),
                region: Some("us-west-2".into()),
            }
        );
        assert_eq!(
            profile_settings(CONFIG, Some("bare")),
            ProfileSettings::default()
        );
        assert_eq!(
            profile_settings(CONFIG, Some("none")),
            ProfileSettings::default()
        );
    }

    #[test]
    fn the_config_file_is_found_as_the_aws_tools_find_it() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            config_path(&env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.aws/config"))
        );
        assert_eq!(
            config_path(&env(&[("HOME", "/h"), ("AWS_CONFIG_FILE", "~/c")])),
            Some(PathBuf::from("/h/c"))
        );
        assert_eq!(config_path(&env(&[])), None);
    }
}
