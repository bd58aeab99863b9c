//! `slinky-host plugin check`: load a plugin, show what it says about itself, build inputs with
//! it through the output policy, and diff its outputs against the bundled builder's, so an author
//! sees exactly what they changed.

use crate::plugins::Builder as _;
use std::{fmt::Write as _, path::PathBuf, sync::Arc};

use kube::ResourceExt;
use serde_json::Value;
use slinky_api::{Controller, NodeSet};

use super::{
    print,
    render::{self, Manifest, Parent, References},
};
use crate::{
    plugins::{BuilderKind, EngineHandle, Plugin, PluginError, bundled},
    revision::pod_revision,
};

/// The result of a check: the report text and whether every build passed.
#[derive(Debug)]
pub struct CheckReport {
    /// What to print.
    pub text: String,
    /// Every build passed the policy.
    pub ok: bool,
}

/// The example Controller, NodeSet, RestApi, LoginSet and Accounting (the SDK's `testing`
/// examples), as manifests.
///
/// # Errors
/// Never in practice: the examples are tested.
pub fn example_manifests() -> anyhow::Result<Vec<Manifest>> {
    let controller = slinky_api::contract::example_controller().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let nodeset = slinky_api::contract::example_nodeset().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let restapi = slinky_api::contract::example_restapi().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let loginset = slinky_api::contract::example_loginset().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let accounting = slinky_api::contract::example_accounting().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(vec![
        Manifest {
            at: "example Controller".into(),
            parent: Parent::Controller(Box::new(controller)),
        },
        Manifest {
            at: "example NodeSet".into(),
            parent: Parent::NodeSet(Box::new(nodeset)),
        },
        Manifest {
            at: "example RestApi".into(),
            parent: Parent::RestApi(Box::new(restapi)),
        },
        Manifest {
            at: "example LoginSet".into(),
            parent: Parent::LoginSet(Box::new(loginset)),
        },
        Manifest {
            at: "example Accounting".into(),
            parent: Parent::Accounting(Box::new(accounting)),
        },
    ])
}

/// Remove what always differs between two builders (their names, digests, and the revision
/// derived from the digest), and server-irrelevant nulls.
fn normalize(mut v: Value) -> Value {
    // A StatefulSet's pod template carries the builder annotations too.
    if let Some(a) = v
        .pointer_mut("/spec/template/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(slinky_api::keys::ANNOTATION_BUILDER);
        a.remove(slinky_api::keys::ANNOTATION_BUILDER_DIGEST);
    }
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for (field, key) in [
            ("annotations", slinky_api::keys::ANNOTATION_BUILDER),
            ("annotations", slinky_api::keys::ANNOTATION_BUILDER_DIGEST),
            ("labels", slinky_api::keys::LABEL_REVISION_HASH),
        ] {
            if let Some(map) = meta.get_mut(field).and_then(Value::as_object_mut) {
                map.remove(key);
            }
        }
    }
    v
}

/// A line diff of `a` → `b` with three lines of context, `-`/`+`/` ` prefixed; empty when equal.
pub fn diff_lines(a: &str, b: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    // Longest common subsequence table (objects are a few hundred lines at most).
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    const CONTEXT: usize = 3;
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, (c, _))| *c != ' ')
        .map(|(k, _)| k)
        .collect();
    let mut out = String::new();
    let mut last_printed: Option<usize> = None;
    for (k, (c, line)) in ops.iter().enumerate() {
        let near = changed.iter().any(|&x| x.abs_diff(k) <= CONTEXT);
        if !near {
            continue;
        }
        if last_printed.is_some_and(|l| l + 1 != k) {
            out.push_str("  ...\n");
        }
        let _ = writeln!(out, "{c} {line}");
        last_printed = Some(k);
    }
    out
}

/// Counts of a check, and the per-object report.
#[derive(Default)]
struct Tally {
    built: usize,
    differ: usize,
    failed: usize,
}

impl Tally {
    fn report(
        &mut self,
        out: &mut String,
        what: String,
        ours: Result<Value, PluginError>,
        theirs: Result<Value, PluginError>,
    ) {
        match ours {
            Err(e) => {
                self.failed += 1;
                let _ = writeln!(out, "FAIL {what}\n  {e}\n");
            }
            Ok(ours) => {
                self.built += 1;
                let theirs = theirs.map(normalize).unwrap_or(Value::Null);
                let d = diff_lines(&yaml(&theirs), &yaml(&normalize(ours)));
                if d.is_empty() {
                    let _ = writeln!(out, "ok   {what}: the same as the bundled builder's\n");
                } else {
                    self.differ += 1;
                    let _ = writeln!(
                        out,
                        "ok   {what}: changes against the bundled builder (- bundled, + this plugin):\n{d}"
                    );
                }
            }
        }
    }
}

impl Tally {
    /// Report each child of a children builder, matched with the bundled builder's by kind and name.
    fn report_children(
        &mut self,
        out: &mut String,
        at: &str,
        ours: Result<Vec<crate::plugins::Child>, PluginError>,
        theirs: Result<Vec<crate::plugins::Child>, PluginError>,
    ) {
        let theirs = theirs.unwrap_or_default();
        match ours {
            Err(e) => self.report(out, format!("children {at}"), Err(e), Ok(Value::Null)),
            Ok(ours) => {
                for child in &ours {
                    let base = theirs
                        .iter()
                        .find(|b| b.kind == child.kind && b.name() == child.name())
                        .map(|b| b.object.clone())
                        .unwrap_or(Value::Null);
                    self.report(
                        out,
                        format!("{} {at}", child.describe()),
                        Ok(child.object.clone()),
                        Ok(base),
                    );
                }
                for gone in theirs
                    .iter()
                    .filter(|b| !ours.iter().any(|c| c.kind == b.kind && c.name() == b.name()))
                {
                    self.differ += 1;
                    let _ = writeln!(
                        out,
                        "ok   {} {at}: built by the bundled builder, not by this plugin (the host would delete it)\n",
                        gone.describe()
                    );
                }
            }
        }
    }
}

fn yaml(v: &Value) -> String {
    serde_saphyr::to_string(v).unwrap_or_default()
}

/// Check the plugin at `path` on `manifests` (the examples when empty), without Secrets or
/// ConfigMaps in the input.
///
/// # Errors
/// The plugin does not load (the error names the cause and the fix), or the inputs don't parse.
pub fn check(
    engine: &Arc<EngineHandle>,
    path: &std::path::Path,
    manifests: &[Manifest],
    ctx: &crate::BuildContext,
) -> anyhow::Result<CheckReport> {
    check_with(engine, path, manifests, &References::default(), ctx)
}

/// Check the plugin at `path` on `manifests` (the examples when empty) and the Secrets and
/// ConfigMaps they reference.
///
/// # Errors
/// The plugin does not load (the error names the cause and the fix), or the inputs don't parse.
pub fn check_with(
    engine: &Arc<EngineHandle>,
    path: &std::path::Path,
    manifests: &[Manifest],
    references: &References,
    ctx: &crate::BuildContext,
) -> anyhow::Result<CheckReport> {
    use anyhow::Context as _;
    let plugin =
        Plugin::load_file(engine, path).with_context(|| format!("{} does not load", path.display()))?;
    let examples;
    let manifests = if manifests.is_empty() {
        examples = example_manifests()?;
        &examples[..]
    } else {
        manifests
    };
    let mut check = Check {
        engine,
        plugin: &plugin,
        ctx,
        manifests,
        references,
        controllers: render::controllers(manifests),
        tally: Tally::default(),
        out: header(&plugin),
    };
    for m in manifests {
        match &m.parent {
            Parent::Controller(c) => {
                check.service(m, c)?;
                check.controller_children(m, c)?;
            }
            Parent::NodeSet(n) => {
                check.nodeset_children(m, n)?;
                check.pods(m, n)?;
            }
            Parent::RestApi(r) => check.restapi_children(m, r)?,
            Parent::LoginSet(l) => check.loginset_children(m, l)?,
            Parent::Accounting(a) => check.accounting_children(m, a)?,
        }
    }
    Ok(check.finish())
}

/// What the plugin says about itself, as the report's first lines.
fn header(plugin: &Plugin) -> String {
    let info = plugin.info();
    format!(
        "plugin: {}@{}\nkinds: {}\ncontract: {} (this host: {})\ndigest: sha256:{}\n\n",
        info.name,
        info.version,
        kinds(plugin),
        info.contract_version,
        crate::plugins::CONTRACT_VERSION,
        plugin.digest()
    )
}

/// The kinds `plugin` builds, comma-separated.
fn kinds(plugin: &Plugin) -> String {
    plugin
        .info()
        .kinds
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A check under way: the plugin, its inputs, and the report so far.
struct Check<'a> {
    engine: &'a Arc<EngineHandle>,
    plugin: &'a Plugin,
    ctx: &'a crate::BuildContext,
    manifests: &'a [Manifest],
    references: &'a References,
    controllers: Vec<&'a Controller>,
    tally: Tally,
    out: String,
}

impl<'a> Check<'a> {
    /// The bundled builder of `kind`, to compare with.
    fn bundled(&self, kind: BuilderKind) -> Result<Plugin, PluginError> {
        Plugin::load(
            self.engine,
            bundled::bundled_bytes(kind),
            crate::plugins::PluginSource::Bundled,
        )
    }

    /// The Controller of `n` among the inputs.
    fn controller_of(&self, n: &NodeSet) -> Option<&'a Controller> {
        self.controllers
            .iter()
            .find(|c| {
                c.namespace().as_deref() == Some(n.controller_namespace())
                    && c.name_any() == n.spec.controller_ref.name
            })
            .copied()
    }

    /// The Service of a Controller that runs slurmctld, when the plugin builds it.
    fn service(&mut self, m: &Manifest, c: &Controller) -> anyhow::Result<()> {
        if !self.plugin.builds(BuilderKind::ControllerService) || c.spec.external {
            return Ok(());
        }
        let base = self.bundled(BuilderKind::ControllerService)?;
        let what = format!(
            "Service of Controller {}/{} ({})",
            c.namespace().unwrap_or_default(),
            c.name_any(),
            m.at
        );
        let ours = self
            .plugin
            .build_service(self.ctx, c)
            .map(|s| serde_json::to_value(s).unwrap_or_default());
        let theirs = base
            .build_service(self.ctx, c)
            .map(|s| serde_json::to_value(s).unwrap_or_default());
        self.tally.report(&mut self.out, what, ours, theirs);
        Ok(())
    }

    /// A Controller's other children, when the plugin builds them.
    fn controller_children(&mut self, m: &Manifest, c: &Controller) -> anyhow::Result<()> {
        if !self.plugin.builds(BuilderKind::ControllerChildren) {
            return Ok(());
        }
        let base = self.bundled(BuilderKind::ControllerChildren)?;
        let inputs = self.references.inputs(c, self.manifests);
        let ours = self.plugin.build_controller_children(self.ctx, c, &inputs);
        let theirs = base.build_controller_children(self.ctx, c, &inputs);
        let at = format!(
            "of Controller {}/{} ({})",
            c.namespace().unwrap_or_default(),
            c.name_any(),
            m.at
        );
        self.tally.report_children(&mut self.out, &at, ours, theirs);
        Ok(())
    }

    /// A NodeSet's children other than pods, when the plugin builds them and its Controller is
    /// among the inputs.
    fn nodeset_children(&mut self, m: &Manifest, n: &NodeSet) -> anyhow::Result<()> {
        if !self.plugin.builds(BuilderKind::NodesetChildren) {
            return Ok(());
        }
        let Some(controller) = self.controller_of(n) else {
            return Ok(());
        };
        let base = self.bundled(BuilderKind::NodesetChildren)?;
        let ours = self.plugin.build_nodeset_children(self.ctx, n, controller);
        let theirs = base.build_nodeset_children(self.ctx, n, controller);
        let at = format!(
            "of NodeSet {}/{} ({})",
            n.namespace().unwrap_or_default(),
            n.name_any(),
            m.at
        );
        self.tally.report_children(&mut self.out, &at, ours, theirs);
        Ok(())
    }

    /// A RestApi's children, when the plugin builds them and its Controller is among the inputs.
    fn restapi_children(&mut self, m: &Manifest, r: &slinky_api::RestApi) -> anyhow::Result<()> {
        if !self.plugin.builds(BuilderKind::RestapiChildren) {
            return Ok(());
        }
        let ns = r.namespace().unwrap_or_default();
        let Some(controller) = self.controllers.iter().copied().find(|c| {
            c.namespace().as_deref() == Some(ns.as_str()) && c.name_any() == r.spec.controller_ref.name
        }) else {
            return Ok(());
        };
        let base = self.bundled(BuilderKind::RestapiChildren)?;
        let ours = self.plugin.build_restapi_children(self.ctx, r, controller);
        let theirs = base.build_restapi_children(self.ctx, r, controller);
        let at = format!("of RestApi {ns}/{} ({})", r.name_any(), m.at);
        self.tally.report_children(&mut self.out, &at, ours, theirs);
        Ok(())
    }

    /// A LoginSet's children, when the plugin builds them and its Controller is among the inputs.
    fn loginset_children(&mut self, m: &Manifest, l: &slinky_api::LoginSet) -> anyhow::Result<()> {
        if !self.plugin.builds(BuilderKind::LoginsetChildren) {
            return Ok(());
        }
        let ns = l.namespace().unwrap_or_default();
        let Some(controller) = self.controllers.iter().copied().find(|c| {
            c.namespace().as_deref() == Some(ns.as_str()) && c.name_any() == l.spec.controller_ref.name
        }) else {
            return Ok(());
        };
        let inputs = self.references.loginset_inputs(l);
        let base = self.bundled(BuilderKind::LoginsetChildren)?;
        let ours = self
            .plugin
            .build_loginset_children(self.ctx, l, controller, &inputs);
        let theirs = base.build_loginset_children(self.ctx, l, controller, &inputs);
        let at = format!("of LoginSet {ns}/{} ({})", l.name_any(), m.at);
        self.tally.report_children(&mut self.out, &at, ours, theirs);
        Ok(())
    }

    /// An Accounting's children, when the plugin builds them.
    fn accounting_children(&mut self, m: &Manifest, a: &slinky_api::Accounting) -> anyhow::Result<()> {
        if !self.plugin.builds(BuilderKind::AccountingChildren) {
            return Ok(());
        }
        let ns = a.namespace().unwrap_or_default();
        let inputs = self.references.accounting_inputs(a);
        let base = self.bundled(BuilderKind::AccountingChildren)?;
        let ours = self.plugin.build_accounting_children(self.ctx, a, &inputs);
        let theirs = base.build_accounting_children(self.ctx, a, &inputs);
        let at = format!("of Accounting {ns}/{} ({})", a.name_any(), m.at);
        self.tally.report_children(&mut self.out, &at, ours, theirs);
        Ok(())
    }

    /// A NodeSet's pods (at least one), when the plugin builds them; a failure when its
    /// Controller is not among the inputs.
    fn pods(&mut self, m: &Manifest, n: &NodeSet) -> anyhow::Result<()> {
        if !self.plugin.builds(BuilderKind::NodesetPod) {
            return Ok(());
        }
        let base = self.bundled(BuilderKind::NodesetPod)?;
        let Some(controller) = self.controller_of(n) else {
            self.tally.failed += 1;
            let _ = writeln!(
                self.out,
                "FAIL NodeSet {} ({}): its Controller {}/{} is not among the inputs: add it with -f\n",
                n.name_any(),
                m.at,
                n.controller_namespace(),
                n.spec.controller_ref.name
            );
            return Ok(());
        };
        let ctx = self.ctx;
        // A builder that fails fails building its pods below, where the report says so.
        let ours_rev = pod_revision(self.plugin, n, controller, ctx).unwrap_or_default();
        let base_rev = pod_revision(&base, n, controller, ctx).unwrap_or_default();
        for ordinal in 0..u32::try_from(n.replicas()).unwrap_or(0).max(1) {
            let ours_id = crate::PodIdentity::for_ordinal(n, ordinal, &ours_rev);
            let base_id = crate::PodIdentity::for_ordinal(n, ordinal, &base_rev);
            let what = format!(
                "Pod {} of NodeSet {}/{} ({})",
                ours_id.name,
                n.namespace().unwrap_or_default(),
                n.name_any(),
                m.at
            );
            let ours = self
                .plugin
                .build_pod(ctx, n, controller, &ours_id)
                .map(|p| serde_json::to_value(p).unwrap_or_default());
            let theirs = base
                .build_pod(ctx, n, controller, &base_id)
                .map(|p| serde_json::to_value(p).unwrap_or_default());
            self.tally.report(&mut self.out, what, ours, theirs);
        }
        Ok(())
    }

    /// The report, with its last line: the counts, and a note when nothing was built.
    fn finish(self) -> CheckReport {
        let Check {
            mut out,
            tally,
            plugin,
            ..
        } = self;
        let Tally {
            built,
            differ,
            failed,
        } = tally;
        let _ = writeln!(
            out,
            "{}: {built} object(s) built and passing the output policy, {differ} differing from the bundled builder \
             (builder annotations and the revision label are not shown), {failed} failed",
            if failed == 0 { "OK" } else { "FAILED" }
        );
        if built + failed == 0 {
            let _ = writeln!(
                out,
                "note: no input has a parent of the kinds this plugin builds ({}); pass -f with a Controller and/or NodeSet",
                kinds(plugin)
            );
        }
        CheckReport {
            text: out,
            ok: failed == 0,
        }
    }
}

/// `plugin check`: check the plugin at `path` on the manifests of `files` (the examples when
/// none) and print the report (with `--settings`, the dispatcher first runs
/// `plugin::check_settings`).
///
/// # Errors
/// As [`check_with`], or an input file that does not read; a failed build fails the command
/// after the report is printed.
pub fn execute(
    engine: &Arc<EngineHandle>,
    path: &std::path::Path,
    files: &[PathBuf],
    cluster_domain: String,
) -> anyhow::Result<()> {
    let manifests = render::read_manifests(files)?;
    let references = render::read_references(files)?;
    let ctx = crate::BuildContext {
        cluster_domain,
        ..crate::BuildContext::default()
    };
    let report = check_with(engine, path, &manifests, &references, &ctx)?;
    print(&report.text)?;
    if !report.ok {
        anyhow::bail!("{} failed on some inputs (see FAIL above)", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_shows_only_changes_with_context() {
        let a = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n";
        let b = "a\nb\nc\nd\ne\nX\nf\ng\nh\ni\nj\n";
        let d = diff_lines(a, b);
        assert_eq!(d, "  c\n  d\n  e\n+ X\n  f\n  g\n  h\n");
        assert_eq!(diff_lines(a, a), "");
        let d = diff_lines("a\nb\n", "a\nc\n");
        assert_eq!(d, "  a\n- b\n+ c\n");
    }
}
