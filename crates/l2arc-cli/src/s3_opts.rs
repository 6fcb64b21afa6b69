//! The flags that say where an object store is (`s3://BUCKET[/PREFIX]`
//! sources of `mount` and `serve-nbd`) and how long to trust what it says.
//!
//! Credentials are taken the way the AWS tools take them, never from a
//! flag (a flag shows in `ps`): AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
//! AWS_SESSION_TOKEN, AWS_PROFILE, ~/.aws/credentials and ~/.aws/config.
//! The endpoint and region come from the flags (or the config file), else
//! the environment (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, AWS_REGION,
//! AWS_DEFAULT_REGION), else the selected profile of ~/.aws/config, as the
//! AWS tools take them. Nothing here ever prints a secret: messages name
//! the bucket and prefix only.

use std::sync::Arc;

use anyhow::{Result, bail};
use clap::Args;
use l2arc::primary::object_store::{
    METADATA_TTL_DEFAULT_MS, ObjectStoreConfig, ObjectStorePrimary, READ_DEADLINE_DEFAULT_MS,
    REQUEST_TIMEOUT_DEFAULT_MS, RETRIES_DEFAULT, S3Location, parse_s3_uri,
};
use l2arc::{
    SHARED_PUT_TIMEOUT_DEFAULT_MS, SHARED_TIMEOUT_DEFAULT_MS, SharedAdmit, SharedTierConfig,
};
use l2arc_cli::service::S3FileOptions;

/// Every flag here is also a key of `--config FILE` (underscores for
/// dashes: `s3_read_deadline = 30`); a flag wins over the file.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct S3Options {
    /// S3 endpoint URL (a non-AWS server: http://127.0.0.1:7070); default
    /// AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's endpoint_url in
    /// ~/.aws/config, else AWS.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// S3 region; default AWS_REGION, AWS_DEFAULT_REGION, the profile's
    /// region, else us-east-1.
    #[arg(long)]
    pub s3_region: Option<String>,
    /// Virtual-host addressing (BUCKET.endpoint) instead of path style.
    #[arg(long)]
    pub s3_virtual_host: bool,
    /// Seconds a listing, a stat or a missing key of the object store is
    /// trusted (also the attribute timeout of an s3:// mount) [default: 60].
    #[arg(long)]
    pub metadata_ttl: Option<f64>,
    /// Tries of one S3 request beyond the first (503 SlowDown, timeouts,
    /// dropped connections), with capped exponential backoff [default: 4].
    #[arg(long)]
    pub s3_retries: Option<u32>,
    /// Seconds one S3 request may take (a streamed read: until its first
    /// byte, and between two pieces) [default: 5].
    #[arg(long)]
    pub s3_timeout: Option<f64>,
    /// Seconds one read may take in all, every try and backoff included;
    /// past it the read fails with EIO [default: 30].
    #[arg(long)]
    pub s3_read_deadline: Option<f64>,
    /// Past --metadata-ttl, keep serving what is cached when the store
    /// cannot be reached (timeouts, refused connections, 5xx), as HTTP
    /// caches' stale-if-error; never once the store said an object changed
    /// or is gone.
    #[arg(long)]
    pub stale_if_error: bool,
    /// A cache tier shared by a fleet of nodes, in an S3 bucket:
    /// s3://BUCKET[/PREFIX]. Read after the L2ARC, before the source;
    /// records read from the source are written to it behind the reader
    /// (docs/operations.md, docs/scale-out.md). s3:// sources only.
    #[arg(long, value_name = "S3_URI")]
    pub shared_cache: Option<String>,
    /// The shared cache's endpoint URL [default: the source's].
    #[arg(long)]
    pub shared_cache_endpoint: Option<String>,
    /// The shared cache's region [default: the source's].
    #[arg(long)]
    pub shared_cache_region: Option<String>,
    /// The AWS profile whose credentials sign the shared cache's requests
    /// [default: the source's credentials].
    #[arg(long)]
    pub shared_cache_profile: Option<String>,
    /// A file holding the fleet's secret (at least 32 bytes): blocks are
    /// signed with it (HMAC-SHA256) and only signed blocks are used, so
    /// that write access to the cache bucket alone cannot poison the fleet.
    #[arg(long, value_name = "FILE")]
    pub shared_cache_key_file: Option<std::path::PathBuf>,
    /// Which records this node writes to the shared cache: all (every
    /// record read from the source) or mfu (only those the local ARC saw
    /// twice) [default: all].
    #[arg(long, value_name = "all|mfu")]
    pub shared_cache_admit: Option<String>,
    /// Seconds one read of the shared cache may take; past it the read is
    /// a miss (its record comes from the source), and after three in a row
    /// the tier is skipped and retried with backoff [default: 0.2]. (A
    /// write has --shared-cache-put-timeout.)
    #[arg(long)]
    pub shared_cache_timeout: Option<f64>,
    /// Seconds one write of a block to the shared cache may take, behind
    /// the reader; past it the block is dropped and counted
    /// (shared_write_timeouts), and the tier is not skipped [default: 5].
    /// Raise it on a slow link to the cache bucket.
    #[arg(long)]
    pub shared_cache_put_timeout: Option<f64>,
}

/// True if `src` names an object store.
pub(crate) fn is_s3(src: &std::path::Path) -> bool {
    src.to_str().is_some_and(|s| s.starts_with("s3://"))
}

/// Seconds of a setting, checked against its range, in ms.
fn seconds_ms(name: &str, value: f64, range: std::ops::RangeInclusive<f64>) -> Result<u64> {
    if !(value.is_finite() && range.contains(&value)) {
        bail!(
            "{name} must be between {} and {} seconds, not {value}",
            range.start(),
            range.end()
        );
    }
    Ok((value * 1000.0).round() as u64)
}

impl S3Options {
    /// Builds the primary for `uri` and checks at once that the bucket
    /// exists and takes the credentials (one-line error otherwise).
    /// `single_key`: `uri` names one object (an NBD export). The flags win
    /// over `file` (the config file's keys), which wins over the defaults.
    pub(crate) fn connect(
        &self,
        uri: &str,
        single_key: bool,
        file: &S3FileOptions,
    ) -> Result<Arc<ObjectStorePrimary>> {
        let config = self.store_config(uri, single_key, file)?;
        let store = ObjectStorePrimary::new(config).map_err(|e| anyhow::anyhow!("{e}"))?;
        store.check().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Arc::new(store))
    }

    /// The store's configuration: the flags over `file` over the defaults,
    /// each checked against its range.
    pub(crate) fn store_config(
        &self,
        uri: &str,
        single_key: bool,
        file: &S3FileOptions,
    ) -> Result<ObjectStoreConfig> {
        let Some(parsed) = parse_s3_uri(uri) else {
            bail!("{uri} is not an s3:// URI");
        };
        let (bucket, prefix) = parsed?;
        let metadata_ttl_ms = seconds_ms(
            "--metadata-ttl",
            self.metadata_ttl
                .or(file.metadata_ttl)
                .unwrap_or(METADATA_TTL_DEFAULT_MS as f64 / 1000.0),
            0.0..=86_400.0,
        )?;
        let request_timeout_ms = seconds_ms(
            "--s3-timeout",
            self.s3_timeout
                .or(file.timeout)
                .unwrap_or(REQUEST_TIMEOUT_DEFAULT_MS as f64 / 1000.0),
            0.1..=3600.0,
        )?;
        let read_deadline_ms = seconds_ms(
            "--s3-read-deadline",
            self.s3_read_deadline
                .or(file.read_deadline)
                .unwrap_or(READ_DEADLINE_DEFAULT_MS as f64 / 1000.0),
            0.1..=3600.0,
        )?;
        let retries_max = self.s3_retries.or(file.retries).unwrap_or(RETRIES_DEFAULT);
        if retries_max > 30 {
            bail!("--s3-retries must be at most 30, not {retries_max}");
        }
        let (dir_prefix, key) = if single_key {
            if prefix.is_empty() {
                bail!("{uri}: name an object: s3://BUCKET/KEY");
            }
            match prefix.rsplit_once('/') {
                Some((dir, key)) => (dir.to_string(), key.to_string()),
                None => (String::new(), prefix.clone()),
            }
        } else {
            (prefix.clone(), String::new())
        };
        let mut config = ObjectStoreConfig::s3(&S3Location {
            bucket: bucket.clone(),
            prefix: dir_prefix,
            endpoint: self.s3_endpoint.clone().or_else(|| file.endpoint.clone()),
            region: self.s3_region.clone().or_else(|| file.region.clone()),
            virtual_host_style: self.s3_virtual_host || file.virtual_host.unwrap_or(false),
        });
        config.metadata_ttl_ms = metadata_ttl_ms;
        config.retries_max = retries_max;
        config.request_timeout_ms = request_timeout_ms;
        config.read_deadline_ms = read_deadline_ms;
        config.stale_if_error = self.stale_if_error || file.stale_if_error.unwrap_or(false);
        if single_key {
            config.single_key = Some(key);
            config.display_name = format!("s3://{bucket}/{prefix}");
        }
        Ok(config)
    }
}

impl S3Options {
    /// Whether a shared cache was asked for, by flag or by the file.
    pub(crate) fn wants_shared_cache(&self, file: &S3FileOptions) -> bool {
        self.shared_cache.is_some() || file.shared_cache.is_some()
    }

    /// Refuses a shared cache in front of a source that is not s3://.
    pub(crate) fn refuse_shared_cache(&self, file: &S3FileOptions, source: &str) -> Result<()> {
        if self.wants_shared_cache(file) {
            bail!(
                "--shared-cache needs an s3:// source, not {source}: blocks are named by the object's bucket, key and ETag"
            );
        }
        Ok(())
    }

    /// The shared tier asked for (flags over `file`), if any: its bucket
    /// and prefix, endpoint and region (the source's by default), its
    /// fleet key read from its file, admission and timeout, each checked.
    pub(crate) fn shared_tier(&self, file: &S3FileOptions) -> Result<Option<SharedTierConfig>> {
        let Some(uri) = self
            .shared_cache
            .clone()
            .or_else(|| file.shared_cache.clone())
        else {
            return Ok(None);
        };
        let Some(parsed) = parse_s3_uri(&uri) else {
            bail!("--shared-cache {uri}: expected s3://BUCKET[/PREFIX]");
        };
        let (bucket, prefix) = parsed.map_err(|e| anyhow::anyhow!("--shared-cache {e}"))?;
        let endpoint = (self.shared_cache_endpoint.clone())
            .or_else(|| file.shared_cache_endpoint.clone())
            .or_else(|| self.s3_endpoint.clone())
            .or_else(|| file.endpoint.clone());
        let region = (self.shared_cache_region.clone())
            .or_else(|| file.shared_cache_region.clone())
            .or_else(|| self.s3_region.clone())
            .or_else(|| file.region.clone());
        let mut store = ObjectStoreConfig::s3(&S3Location {
            bucket,
            prefix,
            endpoint,
            region,
            virtual_host_style: self.s3_virtual_host || file.virtual_host.unwrap_or(false),
        });
        let profile =
            (self.shared_cache_profile.clone()).or_else(|| file.shared_cache_profile.clone());
        if let Some(profile) = profile {
            store.options.push(("profile".to_string(), profile));
        }
        let mut config = SharedTierConfig::new(store);
        let key_file =
            (self.shared_cache_key_file.clone()).or_else(|| file.shared_cache_key_file.clone());
        if let Some(path) = key_file {
            config.fleet_key = Some(read_fleet_key(&path)?);
        }
        if let Some(admit) = self
            .shared_cache_admit
            .as_ref()
            .or(file.shared_cache_admit.as_ref())
        {
            config.admit = admit
                .parse::<SharedAdmit>()
                .map_err(|e| anyhow::anyhow!("--shared-cache-admit: {e}"))?;
        }
        config.timeout_ms = seconds_ms(
            "--shared-cache-timeout",
            self.shared_cache_timeout
                .or(file.shared_cache_timeout)
                .unwrap_or(SHARED_TIMEOUT_DEFAULT_MS as f64 / 1000.0),
            0.01..=60.0,
        )?;
        config.put_timeout_ms = seconds_ms(
            "--shared-cache-put-timeout",
            self.shared_cache_put_timeout
                .or(file.shared_cache_put_timeout)
                .unwrap_or(SHARED_PUT_TIMEOUT_DEFAULT_MS as f64 / 1000.0),
            0.1..=600.0,
        )?;
        Ok(Some(config))
    }
}

/// The fleet key in `path`: its bytes, trailing whitespace cut (a key
/// made with `openssl rand -hex 32 > FILE` ends in a newline), at least 32.
fn read_fleet_key(path: &std::path::Path) -> Result<Vec<u8>> {
    let mut key = std::fs::read(path)
        .map_err(|e| anyhow::anyhow!("--shared-cache-key-file {}: {e}", path.display()))?;
    while key.last().is_some_and(u8::is_ascii_whitespace) {
        key.pop();
    }
    if key.len() < 32 {
        bail!(
            "--shared-cache-key-file {}: {} bytes; a fleet key holds at least 32 (make one with `openssl rand -hex 32 > FILE`)",
            path.display(),
            key.len()
        );
    }
    Ok(key)
}

/// Attaches the shared tier asked for, if any, and says so in one line
/// (bucket and prefix, admission, keyed or not; never the key).
pub(crate) fn attach_shared_tier(
    options: &S3Options,
    file: &S3FileOptions,
    cache: &Arc<l2arc::Cache>,
) -> Result<()> {
    let Some(config) = options.shared_tier(file)? else {
        return Ok(());
    };
    let line = format!(
        "l2arc: shared cache tier {} (admit {}, {}, timeout {} ms, put timeout {} ms)",
        config.store.display_name,
        config.admit,
        if config.fleet_key.is_some() {
            "keyed: blocks signed and checked"
        } else {
            "not keyed"
        },
        config.timeout_ms,
        config.put_timeout_ms
    );
    cache
        .add_shared_tier(config)
        .map_err(|e| anyhow::anyhow!("--shared-cache: {e}"))?;
    eprintln!("{line}");
    Ok(())
}

/// The closing line of an object-store service: what it asked the store
/// and what came of it.
pub(crate) fn print_requests(store: &ObjectStorePrimary) {
    let s = store.stats();
    eprintln!(
        "l2arc: s3 requests: {} GETs ({} bytes), {} HEADs, {} LISTs, {} retries, {} precondition failed, {} outages ({} requests refused in them, {} probes), {} served stale (stale-if-error)",
        s.gets,
        s.get_bytes,
        s.heads,
        s.lists,
        s.retries,
        s.precondition_failed,
        s.outages,
        s.refused_in_outage,
        s.probes,
        s.stale_if_error_hits
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_the_file_over_the_defaults() {
        let file = S3FileOptions {
            endpoint: Some("http://file:9000".into()),
            read_deadline: Some(12.0),
            timeout: Some(2.0),
            stale_if_error: Some(true),
            ..S3FileOptions::default()
        };
        let flags = S3Options {
            s3_read_deadline: Some(7.5),
            ..S3Options::default()
        };
        let c = flags.store_config("s3://b/p", false, &file).unwrap();
        assert_eq!(c.read_deadline_ms, 7_500);
        assert_eq!(c.request_timeout_ms, 2_000);
        assert!(c.stale_if_error);
        assert!(
            c.options
                .contains(&("endpoint".into(), "http://file:9000".into()))
        );
        let c = S3Options::default()
            .store_config("s3://b", false, &S3FileOptions::default())
            .unwrap();
        assert_eq!(c.read_deadline_ms, READ_DEADLINE_DEFAULT_MS);
        assert_eq!(c.request_timeout_ms, REQUEST_TIMEOUT_DEFAULT_MS);
        assert_eq!(c.retries_max, RETRIES_DEFAULT);
        assert!(!c.stale_if_error);
        let bad = S3Options {
            s3_read_deadline: Some(0.0),
            ..S3Options::default()
        };
        let e = bad.store_config("s3://b", false, &file).unwrap_err();
        assert!(e.to_string().contains("--s3-read-deadline"), "{e}");
    }
}
