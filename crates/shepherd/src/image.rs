//! `shepherd image import|ls|rm`: a node's image store, without a registry, as `k3s ctr images`
//! does it. The store is the local node's of a standalone data dir (`<data-dir>/agent/images`) or
//! an agent's (`<data-dir>/images`), and may be changed while that node runs.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use shepherd_image::{ImageRef, ImageStore};

#[derive(Subcommand, Clone, Debug)]
pub enum ImageCommand {
    /// Puts the images of an archive into the node's store: a `docker save` tarball or an OCI
    /// archive (`skopeo copy ... oci-archive:FILE:NAME`); `-` reads standard input. Pods use them
    /// by the names the archive gives, without a pull.
    Import(ImportArgs),
    /// Lists the node's images: name, image id (its config's digest) and size.
    Ls(StoreArgs),
    /// Removes an image's name, and its layers no other image uses.
    Rm(RemoveArgs),
}

#[derive(Args, Clone, Debug)]
pub struct StoreArgs {
    /// The data directory of `shepherd standalone` (its node's images are in agent/images) or of
    /// `shepherd agent` (images).
    #[arg(long, env = "SHEPHERD_DATA_DIR", default_value = "shepherd-data")]
    data_dir: PathBuf,
}

#[derive(Args, Clone, Debug)]
pub struct ImportArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The archive; `-` for standard input.
    file: PathBuf,
}

#[derive(Args, Clone, Debug)]
pub struct RemoveArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The image, as a pod names it (`busybox:1`, `example.com/app:2`).
    image: String,
}

/// The image store of the node whose data dir is `data_dir`.
fn store_of(data_dir: &Path) -> anyhow::Result<ImageStore> {
    anyhow::ensure!(data_dir.is_dir(), "{} is not a data directory (start shepherd with it first)", data_dir.display());
    let standalone = data_dir.join("agent");
    let root = if standalone.is_dir() { standalone.join("images") } else { data_dir.join("images") };
    ImageStore::open(&root).with_context(|| format!("opening the image store {}", root.display()))
}

pub fn run(command: ImageCommand) -> anyhow::Result<()> {
    match command {
        ImageCommand::Import(args) => {
            let store = store_of(&args.store.data_dir)?;
            let archive: Box<dyn Read> = if args.file.as_os_str() == "-" {
                Box::new(std::io::stdin().lock())
            } else {
                let file = std::fs::File::open(&args.file).with_context(|| format!("opening {}", args.file.display()))?;
                Box::new(std::io::BufReader::new(file))
            };
            let records = shepherd_image::import(&store, archive).with_context(|| format!("importing {}", args.file.display()))?;
            for r in records {
                println!("imported {} ({}, {})", r.reference, r.config_digest, human_size(r.size));
            }
            Ok(())
        }
        ImageCommand::Ls(args) => {
            let mut images = store_of(&args.data_dir)?.images()?;
            images.sort_by(|a, b| a.reference.cmp(&b.reference));
            let width = images.iter().map(|i| i.reference.len()).max().unwrap_or(0).max("IMAGE".len());
            println!("{:width$}  {:19}  SIZE", "IMAGE", "IMAGE ID");
            for i in images {
                let id = i.config_digest.hex().get(..12).unwrap_or_default().to_string();
                println!("{:width$}  sha256:{id}  {}", i.reference, human_size(i.size));
            }
            Ok(())
        }
        ImageCommand::Rm(args) => {
            let store = store_of(&args.store.data_dir)?;
            let reference = ImageRef::parse(&args.image)?.to_string();
            anyhow::ensure!(store.image(&reference)?.is_some(), "image {reference} is not on this node");
            let freed = store.remove_image(&reference)?;
            println!("removed {reference} ({} freed)", human_size(freed));
            Ok(())
        }
    }
}

fn human_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20)),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}
