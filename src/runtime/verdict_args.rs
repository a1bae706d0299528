//! The command-line input of the offline verdict, shared by `pd-operator validate` and
//! `kubectl pd validate`: the manifests, the model's config.json, and what to assume where a
//! spec is silent.

use std::path::PathBuf;

use pd_core::offline::Assumed;

#[derive(clap::Args, Debug)]
pub struct VerdictArgs {
    /// YAML files; multi-document files and ConfigMaps for `model.configMapRef` are accepted.
    #[arg(short = 'f', long = "filename", required = true)]
    pub files: Vec<PathBuf>,
    /// The model's HF config.json, used for every PDDeployment read.
    #[arg(long)]
    pub model_config: Option<PathBuf>,
    /// Check for pods on this GPU (H100, H200, B200) where a role's `accelerator` is unset.
    #[arg(long, value_parser = pd_api::Accelerator::parse)]
    pub accelerator: Option<pd_api::Accelerator>,
    /// Judge with this SGLang release (e.g. 0.5.21) where a spec sets no `engine.version`.
    #[arg(long)]
    pub engine_version: Option<String>,
}

impl VerdictArgs {
    pub fn assumed(&self) -> Assumed<'_> {
        Assumed { accelerator: self.accelerator, engine_version: self.engine_version.as_deref() }
    }
}
