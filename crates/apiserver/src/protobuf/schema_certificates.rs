//! Layout of the protobuf messages of `certificates.k8s.io/v1`: field numbers, JSON names and types, as
//! Kubernetes' generated.proto gives them.

use super::Ty::*;
use super::{Message, one, rep};

const TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Time";

pub(super) static MESSAGES: &[Message] = &[
    Message { name: "k8s.io.api.certificates.v1.CertificateSigningRequest", fields: &[
        one(1, "metadata", Msg("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta")),
        one(2, "spec", Msg("k8s.io.api.certificates.v1.CertificateSigningRequestSpec")),
        one(3, "status", Msg("k8s.io.api.certificates.v1.CertificateSigningRequestStatus")),
    ] },
    Message { name: "k8s.io.api.certificates.v1.CertificateSigningRequestCondition", fields: &[
        one(1, "type", Str),
        one(6, "status", Str),
        one(2, "reason", Str),
        one(3, "message", Str),
        one(4, "lastUpdateTime", Msg(TIME)),
        one(5, "lastTransitionTime", Msg(TIME)),
    ] },
    Message { name: "k8s.io.api.certificates.v1.CertificateSigningRequestList", fields: &[
        one(1, "metadata", Msg("k8s.io.apimachinery.pkg.apis.meta.v1.ListMeta")),
        rep(2, "items", Msg("k8s.io.api.certificates.v1.CertificateSigningRequest")),
    ] },
    Message { name: "k8s.io.api.certificates.v1.CertificateSigningRequestSpec", fields: &[
        one(1, "request", Bytes),
        one(7, "signerName", Str),
        one(8, "expirationSeconds", I32),
        rep(5, "usages", Str),
        one(2, "username", Str),
        one(3, "uid", Str),
        rep(4, "groups", Str),
        one(6, "extra", Map(&Msg("k8s.io.api.certificates.v1.ExtraValue"))),
    ] },
    Message { name: "k8s.io.api.certificates.v1.CertificateSigningRequestStatus", fields: &[
        rep(1, "conditions", Msg("k8s.io.api.certificates.v1.CertificateSigningRequestCondition")),
        one(2, "certificate", Bytes),
    ] },
    Message { name: "k8s.io.api.certificates.v1.ExtraValue", fields: &[
        rep(1, "items", Str),
    ] },
];
