//! The flags that say where an object store is (`s3://BUCKET[/PREFIX]`
//! sources of `mount` and `serve-nbd`) and how long to trust what it says.
//!
//! Credentials are taken the way the AWS tools take them, never from a
//! flag (a flag shows in `ps`): AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
//! AWS_SESSION_TOKEN, AWS_PROFILE, ~/.aws/credentials and ~/.aws/config.
//! The endpoint and region come from the flags, else AWS_ENDPOINT_URL and
//! AWS_REGION / AWS_DEFAULT_REGION. Nothing here ever prints a secret:
//! messages name the bucket and prefix only.

use std::sync::Arc;

use anyhow::{Result, bail};
use clap::Args;
use l2arc::primary::object_store::{
    METADATA_TTL_DEFAULT_MS, ObjectStoreConfig, ObjectStorePrimary, S3Location, parse_s3_uri,
};

#[derive(Args, Debug, Clone)]
pub(crate) struct S3Options {
    /// S3 endpoint URL (a non-AWS server: http://127.0.0.1:7070); default
    /// AWS_ENDPOINT_URL, else AWS.
    #[arg(long)]
    pub s3_endpoint: Option<String>,
    /// S3 region; default AWS_REGION, AWS_DEFAULT_REGION, else us-east-1.
    #[arg(long)]
    pub s3_region: Option<String>,
    /// Virtual-host addressing (BUCKET.endpoint) instead of path style.
    #[arg(long)]
    pub s3_virtual_host: bool,
    /// Seconds a listing, a stat or a missing key of the object store is
    /// trusted (also the attribute timeout of an s3:// mount).
    #[arg(long, default_value_t = METADATA_TTL_DEFAULT_MS as f64 / 1000.0)]
    pub metadata_ttl: f64,
    /// Tries of one S3 request beyond the first (503 SlowDown, timeouts,
    /// dropped connections), with capped exponential backoff.
    #[arg(long, default_value_t = l2arc::primary::object_store::RETRIES_DEFAULT)]
    pub s3_retries: u32,
    /// Seconds one S3 request may take.
    #[arg(long, default_value_t = 30.0)]
    pub s3_timeout: f64,
}

/// True if `src` names an object store.
pub(crate) fn is_s3(src: &std::path::Path) -> bool {
    src.to_str().is_some_and(|s| s.starts_with("s3://"))
}

impl S3Options {
    /// Builds the primary for `uri` and checks at once that the bucket
    /// exists and takes the credentials (one-line error otherwise).
    /// `single_key`: `uri` names one object (an NBD export).
    pub(crate) fn connect(&self, uri: &str, single_key: bool) -> Result<Arc<ObjectStorePrimary>> {
        let Some(parsed) = parse_s3_uri(uri) else {
            bail!("{uri} is not an s3:// URI");
        };
        let (bucket, prefix) = parsed?;
        if !(self.metadata_ttl.is_finite() && (0.0..=86_400.0).contains(&self.metadata_ttl)) {
            bail!(
                "--metadata-ttl must be between 0 and 86400 seconds, not {}",
                self.metadata_ttl
            );
        }
        if !(self.s3_timeout.is_finite() && (0.1..=3600.0).contains(&self.s3_timeout)) {
            bail!(
                "--s3-timeout must be between 0.1 and 3600 seconds, not {}",
                self.s3_timeout
            );
        }
        if self.s3_retries > 30 {
            bail!("--s3-retries must be at most 30, not {}", self.s3_retries);
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
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            virtual_host_style: self.s3_virtual_host,
        });
        config.metadata_ttl_ms = (self.metadata_ttl * 1000.0) as u64;
        config.retries_max = self.s3_retries;
        config.request_timeout_ms = (self.s3_timeout * 1000.0) as u64;
        if single_key {
            config.single_key = Some(key);
            config.display_name = format!("s3://{bucket}/{prefix}");
        }
        let store = ObjectStorePrimary::new(config).map_err(|e| anyhow::anyhow!("{e}"))?;
        store.check().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Arc::new(store))
    }
}
