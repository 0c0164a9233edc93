//! The CustomResourceDefinition rows of the kubectl compatibility table: each kubectl version
//! defines its own group, so the versions do not see each other's definitions.

use std::time::{Duration, Instant};

use super::{Kubectl, Outcome};

fn group(k: &Kubectl) -> String {
    format!("k{}.compat.example.com", k.label.replace('.', "-"))
}

/// `gizmos.<group>`: what a user types to name the resource without ambiguity.
fn gizmos(k: &Kubectl) -> String {
    format!("gizmos.{}", group(k))
}

fn definition(group: &str, spec_type: &str) -> String {
    format!("apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gizmos.{group}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: gizmos, singular: gizmo, kind: Gizmo, shortNames: [gz]}}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {{}}
      scale: {{specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}}
    additionalPrinterColumns:
    - {{name: Size, type: integer, jsonPath: .spec.size}}
    - {{name: Colour, type: string, jsonPath: .spec.colour, priority: 1}}
    - {{name: Age, type: date, jsonPath: .metadata.creationTimestamp}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            {spec_type}properties:
              size: {{type: integer, minimum: 1, maximum: 10}}
              colour: {{type: string, default: red}}
              replicas: {{type: integer}}
          status:
            type: object
            properties:
              replicas: {{type: integer}}
")
}

fn gizmo(k: &Kubectl, name: &str, spec: &str) -> String {
    format!("apiVersion: {}/v1\nkind: Gizmo\nmetadata:\n  name: {name}\nspec: {spec}\n", group(k))
}

fn write(k: &Kubectl, file: &str, text: &str) -> Result<String, String> {
    let name = format!("{}-{file}", k.label);
    std::fs::write(k.manifests.join(&name), text).map_err(|e| format!("writing {name}: {e}"))?;
    Ok(name)
}

/// Fails unless kubectl fails and says every one of `wanted`.
fn expect_failure(k: &Kubectl, args: &[&str], wanted: &[&str]) -> Outcome {
    match k.run(args) {
        Ok(out) => Err(format!("kubectl {} succeeded:\n{out}", args.join(" "))),
        Err(e) => match wanted.iter().find(|w| !e.contains(*w)) {
            Some(missing) => Err(format!("{missing:?} missing from\n{e}")),
            None => Ok(()),
        },
    }
}

pub fn create_and_serve(k: &Kubectl) -> Outcome {
    let file = write(k, "crd.yaml", &definition(&group(k), "type: object\n            "))?;
    k.expect(&["apply", "-f", &file], &["created"])?;
    let applied = Instant::now();
    let plural = gizmos(k);
    loop {
        match k.run(&["get", &plural]) {
            Ok(_) => break,
            Err(e) if applied.elapsed() > Duration::from_secs(1) => {
                return Err(format!("not served {:?} after the definition was created: {e}", applied.elapsed()));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    Ok(())
}

pub fn apply_object(k: &Kubectl) -> Outcome {
    let file = write(k, "gizmo.yaml", &gizmo(k, "g1", "{size: 3, replicas: 1}"))?;
    k.expect(&["apply", "-f", &file], &["gizmo", "g1 created"])
}

pub fn wide_columns(k: &Kubectl) -> Outcome {
    k.expect(&["get", &gizmos(k), "-o", "wide"], &["NAME", "SIZE", "COLOUR", "AGE", "g1", "3", "red"])
}

pub fn defaulted_and_pruned(k: &Kubectl) -> Outcome {
    let file = write(k, "loose.yaml", &gizmo(k, "g2", "{size: 2, shape: round}"))?;
    k.expect(&["create", "--validate=false", "-f", &file], &["g2 created"])?;
    let obj = k.json(&["get", &gizmos(k), "g2", "-o", "json"])?;
    let spec = &obj["spec"];
    if spec != &serde_json::json!({"size": 2, "colour": "red"}) {
        return Err(format!("wanted the default filled in and the unknown field pruned, got spec {spec}"));
    }
    Ok(())
}

pub fn invalid_object(k: &Kubectl) -> Outcome {
    let file = write(k, "huge.yaml", &gizmo(k, "huge", "{size: 99}"))?;
    expect_failure(k, &["apply", "-f", &file], &["spec.size", "less than or equal to 10"])
}

pub fn scale(k: &Kubectl) -> Outcome {
    k.expect(&["scale", &format!("{}/g1", gizmos(k)), "--replicas=4"], &["scaled"])?;
    k.expect_exactly(&["get", &gizmos(k), "g1", "-o", "jsonpath={.spec.replicas}"], "4")
}

pub fn status_ignores_spec(k: &Kubectl) -> Outcome {
    let patch = r#"{"spec":{"size":9},"status":{"replicas":2}}"#;
    k.expect(&["patch", &gizmos(k), "g1", "--subresource=status", "--type=merge", "-p", patch], &["patched"])?;
    k.expect_exactly(&["get", &gizmos(k), "g1", "-o", "jsonpath={.spec.size}/{.status.replicas}"], "5/2")
}

pub fn non_structural_refused(k: &Kubectl) -> Outcome {
    let bad_group = format!("bad{}", group(k));
    let file = write(k, "bad-crd.yaml", &definition(&bad_group, ""))?;
    expect_failure(k, &["apply", "-f", &file], &[
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
    ])
}

pub fn owned_pod_collected(k: &Kubectl) -> Outcome {
    let uid = k.run(&["get", &gizmos(k), "g1", "-o", "jsonpath={.metadata.uid}"])?;
    let pod = format!("apiVersion: v1
kind: Pod
metadata:
  name: owned-by-gizmo
  ownerReferences:
  - {{apiVersion: {}/v1, kind: Gizmo, name: g1, uid: {uid}}}
spec:
  containers:
  - {{name: c, image: minimal}}
", group(k));
    let file = write(k, "owned-pod.yaml", &pod)?;
    k.expect(&["apply", "-f", &file], &["created"])?;
    k.expect(&["delete", &gizmos(k), "g1"], &["deleted"])?;
    k.run(&["wait", "--for=delete", "pod/owned-by-gizmo", "--timeout=60s"]).map(|_| ())
}

pub fn delete_definition(k: &Kubectl) -> Outcome {
    k.expect(&["delete", "crd", &gizmos(k), "--timeout=60s"], &["deleted"])?;
    expect_failure(k, &["get", &gizmos(k)], &["the server doesn't have a resource type"])
}

pub fn explain(k: &Kubectl) -> Outcome {
    k.expect(&["explain", &gizmos(k)], &["KIND:", "Gizmo", "spec"])?;
    k.expect(&["explain", &format!("{}.spec", gizmos(k))], &["size", "colour", "integer"])
}

pub fn describe(k: &Kubectl) -> Outcome {
    k.expect(&["describe", &gizmos(k), "g1"], &["Name:", "g1", "Kind:", "Gizmo", "Size:"])
}

fn owned_pod(k: &Kubectl, pod: &str, owner: &str) -> Result<String, String> {
    let uid = k.run(&["get", &gizmos(k), owner, "-o", "jsonpath={.metadata.uid}"])?;
    let manifest = format!("apiVersion: v1
kind: Pod
metadata:
  name: {pod}
  ownerReferences:
  - {{apiVersion: {}/v1, kind: Gizmo, name: {owner}, uid: {uid}, blockOwnerDeletion: true}}
spec:
  containers:
  - {{name: c, image: minimal}}
", group(k));
    write(k, &format!("{pod}.yaml"), &manifest)
}

pub fn custom_dependent_collected(k: &Kubectl) -> Outcome {
    k.expect(&["run", "gizmo-owner", "--image=minimal"], &["created"])?;
    let uid = k.run(&["get", "pod", "gizmo-owner", "-o", "jsonpath={.metadata.uid}"])?;
    let g = format!("{}metadata:\n  name: g3\n  ownerReferences:\n  - {{apiVersion: v1, kind: Pod, name: gizmo-owner, uid: {uid}}}\nspec: {{size: 1}}\n",
        format_args!("apiVersion: {}/v1\nkind: Gizmo\n", group(k)));
    let file = write(k, "g3.yaml", &g)?;
    k.expect(&["apply", "-f", &file], &["g3 created"])?;
    k.expect(&["delete", "pod", "gizmo-owner", "--grace-period=0", "--force"], &["deleted"])?;
    k.run(&["wait", "--for=delete", &format!("{}/g3", gizmos(k)), "--timeout=60s"]).map(|_| ())
}

pub fn foreground_deletion(k: &Kubectl) -> Outcome {
    let file = write(k, "g4.yaml", &gizmo(k, "g4", "{size: 1}"))?;
    k.expect(&["apply", "-f", &file], &["g4 created"])?;
    let pod = owned_pod(k, "held-by-g4", "g4")?;
    k.expect(&["apply", "-f", &pod], &["created"])?;
    k.expect(&["delete", &gizmos(k), "g4", "--cascade=foreground", "--timeout=60s"], &["deleted"])?;
    k.run(&["wait", "--for=delete", &format!("{}/g4", gizmos(k)), "--timeout=60s"])?;
    match k.run(&["get", "pod", "held-by-g4"]) {
        Ok(out) => Err(format!("the dependent outlived its owner's foreground deletion:\n{out}")),
        Err(_) => Ok(()),
    }
}

pub fn reapply_and_label(k: &Kubectl) -> Outcome {
    let file = write(k, "gizmo.yaml", &gizmo(k, "g1", "{size: 5, replicas: 1}"))?;
    k.expect(&["apply", "-f", &file], &["g1 configured"])?;
    k.expect(&["label", &gizmos(k), "g1", "tier=fe"], &["labeled"])?;
    k.expect(&["get", "gz", "-l", "tier=fe"], &["g1", "5"])
}
