//! nf_tables transactions written as netlink messages, for changes that must not cost a listing.
//!
//! `nft` loads the table (and for some commands every chain of it) before it writes anything, so
//! its cost grows with the number of Services. A batch of messages (`NFNL_MSG_BATCH_BEGIN`, the
//! changes, `NFNL_MSG_BATCH_END`) is one kernel transaction like an `nft -f` script, and names
//! what it changes without reading anything. Message and attribute numbers are the kernel's uapi
//! (`linux/netfilter/nf_tables.h`, `linux/netfilter/nfnetlink.h`); every number attribute of
//! nf_tables is big-endian, strings end with a NUL.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFPROTO_IPV4: u8 = 2;
const NLA_F_NESTED: u16 = 0x8000;

const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;

const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_TIMEOUT: u16 = 11;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_GOTO: i32 = -4;
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

const NFT_SET_ANONYMOUS: u32 = 0x1;
const NFT_SET_CONSTANT: u32 = 0x2;
const NFT_SET_MAP: u32 = 0x8;
const NFT_SET_TIMEOUT: u32 = 0x10;
const NFT_SET_EVAL: u32 = 0x20;
/// nft's own type numbers, which it reads back to print a set's elements.
const NFT_TYPE_INTEGER: u32 = 4;
const NFT_TYPE_IPADDR: u32 = 7;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
/// The second 32-bit register, the bytes 4..8 of `NFT_REG_1`.
const NFT_REG32_01: u32 = 9;

/// nft's description of an endpoint map (`NFTA_SET_USERDATA`), which it reads back to list the
/// map as `typeof numgen random mod 1 : ip daddr . tcp dport`: libnftnl's type-length-value
/// records (one byte each), key byte order host, data byte order none, the key's expression
/// (numgen: type random, modulus 1, offset 0), the data's (a concatenation of the payload
/// fields ip daddr and tcp dport; the byte at `ENDPOINT_MAP_PROTOCOL` names the protocol). The
/// modulus here is only what nft prints.
const ENDPOINT_MAP_USERDATA: [u8; 100] = [
    0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x03, 0x1a, 0x00, 0x04, 0x17, 0x00, 0x00, 0x00,
    0x01, 0x12, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x01, 0x00, 0x00, 0x00, 0x02, 0x04, 0x00, 0x00, 0x00, 0x00,
    0x04, 0x34, 0x00, 0x04, 0x0d, 0x00, 0x00, 0x00, 0x01, 0x2c, 0x00, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c,
    0x00, 0x04, 0x0c, 0x00, 0x00, 0x00, 0x01, 0x04, 0x0c, 0x00, 0x00, 0x00, 0x01, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00,
    0x01, 0x0c, 0x00, 0x04, 0x08, 0x00, 0x00, 0x00, 0x01, 0x04, 0x02, 0x00, 0x00, 0x00, 0x06, 0x04, 0x00, 0x00, 0x00, 0x00,
];
/// Where `ENDPOINT_MAP_USERDATA` names the port's protocol, by nft's numbers for its protocol
/// descriptions: 8 tcp, 6 udp, 10 sctp.
const ENDPOINT_MAP_PROTOCOL: usize = 84;
/// The data type of an endpoint map: ipv4_addr (7) . inet_service (13), nft's concatenation
/// of type numbers, 6 bits each.
const NFT_TYPE_ADDR_SERVICE: u32 = (NFT_TYPE_IPADDR << 6) | 13;

/// The kernel's limit for table, chain and set names, the NUL included.
const NAME_MAX: usize = 256;
/// Elements per message of a set's elements: keeps each message's element list far below the
/// 64 KiB one netlink attribute can hold.
const ELEMENTS_PER_MESSAGE: usize = 256;

#[derive(Debug, thiserror::Error)]
pub(crate) enum NetlinkError {
    #[error("nftables name {name:?} is {len} bytes, more than the kernel's {max}")]
    NameTooLong { name: String, len: usize, max: usize },
    #[error("an nftables attribute of {0} bytes is more than a netlink attribute holds (65535)")]
    AttributeTooLong(usize),
    #[error("an nftables transaction of {0} bytes is more than the netlink socket takes")]
    TooLarge(usize),
    #[error("netlink socket for nf_tables: {0}")]
    Socket(std::io::Error),
    #[error("the kernel refused to {what}: {error}")]
    Refused { what: String, error: std::io::Error },
    #[error("the kernel did not confirm the nftables transaction")]
    Unconfirmed,
}

/// What an element carries besides its key.
enum Data<'a> {
    None,
    /// `goto chain`, in a verdict map.
    Goto(&'a str),
    /// A value, in a data map.
    Value(&'a [u8]),
}

/// One expression of a rule: its kernel name and its attributes, already encoded.
pub(crate) struct Expr {
    name: &'static str,
    attrs: Vec<u8>,
}

fn put(buf: &mut Vec<u8>, kind: u16, value: &[u8]) -> Result<(), NetlinkError> {
    let len = 4 + value.len();
    let short = u16::try_from(len).map_err(|_| NetlinkError::AttributeTooLong(len))?;
    buf.extend_from_slice(&short.to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(buf.len().next_multiple_of(4), 0);
    Ok(())
}

fn put_u32(buf: &mut Vec<u8>, kind: u16, value: u32) {
    // Four bytes always fit.
    let _ = put(buf, kind, &value.to_be_bytes());
}

fn put_str(buf: &mut Vec<u8>, kind: u16, value: &str) -> Result<(), NetlinkError> {
    let mut bytes = Vec::with_capacity(value.len() + 1);
    bytes.extend_from_slice(value.as_bytes());
    bytes.push(0);
    put(buf, kind, &bytes)
}

fn put_name(buf: &mut Vec<u8>, kind: u16, name: &str) -> Result<(), NetlinkError> {
    if name.len() + 1 > NAME_MAX {
        return Err(NetlinkError::NameTooLong { name: name.to_string(), len: name.len(), max: NAME_MAX - 1 });
    }
    put_str(buf, kind, name)
}

/// A nested attribute whose content `fill` writes.
fn nest(buf: &mut Vec<u8>, kind: u16, fill: impl FnOnce(&mut Vec<u8>) -> Result<(), NetlinkError>) -> Result<(), NetlinkError> {
    let mut inner = Vec::new();
    fill(&mut inner)?;
    put(buf, kind | NLA_F_NESTED, &inner)
}

fn data_value(buf: &mut Vec<u8>, kind: u16, value: &[u8]) -> Result<(), NetlinkError> {
    nest(buf, kind, |b| put(b, NFTA_DATA_VALUE, value))
}

fn goto_verdict(buf: &mut Vec<u8>, kind: u16, chain: &str) -> Result<(), NetlinkError> {
    nest(buf, kind, |b| {
        nest(b, NFTA_DATA_VERDICT, |v| {
            put(v, NFTA_VERDICT_CODE, &NFT_GOTO.to_be_bytes())?;
            put_name(v, NFTA_VERDICT_CHAIN, chain)
        })
    })
}

impl Expr {
    /// `ip saddr` into register 1.
    pub(crate) fn ip_saddr() -> Expr {
        let mut a = Vec::new();
        put_u32(&mut a, 1, NFT_REG_1); // NFTA_PAYLOAD_DREG
        put_u32(&mut a, 2, 1); // NFTA_PAYLOAD_BASE: network header
        put_u32(&mut a, 3, 12); // NFTA_PAYLOAD_OFFSET of the source address
        put_u32(&mut a, 4, 4); // NFTA_PAYLOAD_LEN
        Expr { name: "payload", attrs: a }
    }

    /// Register 1 equals `value`, else the rule ends.
    pub(crate) fn equals(value: &[u8]) -> Expr {
        let mut a = Vec::new();
        put_u32(&mut a, 1, NFT_REG_1); // NFTA_CMP_SREG
        put_u32(&mut a, 2, 0); // NFTA_CMP_OP: NFT_CMP_EQ
        // A register holds 16 bytes, so this never overflows an attribute.
        let _ = data_value(&mut a, 3, value); // NFTA_CMP_DATA
        Expr { name: "cmp", attrs: a }
    }

    /// `meta KEY` into register 1 (3: mark, 16: l4proto).
    fn meta_load(key: u32) -> Expr {
        let mut a = Vec::new();
        put_u32(&mut a, 1, NFT_REG_1); // NFTA_META_DREG
        put_u32(&mut a, 2, key); // NFTA_META_KEY
        Expr { name: "meta", attrs: a }
    }

    pub(crate) fn l4proto() -> Expr {
        Expr::meta_load(16)
    }

    /// `meta mark set meta mark | bits`: three expressions.
    pub(crate) fn set_mark_bits(bits: u32) -> [Expr; 3] {
        let mut bitwise = Vec::new();
        put_u32(&mut bitwise, 1, NFT_REG_1); // NFTA_BITWISE_SREG
        put_u32(&mut bitwise, 2, NFT_REG_1); // NFTA_BITWISE_DREG
        put_u32(&mut bitwise, 3, 4); // NFTA_BITWISE_LEN
        // The mark is a host-order number in its register: `x | bits` is `(x & !bits) ^ bits`.
        let _ = data_value(&mut bitwise, 4, &(!bits).to_ne_bytes()); // NFTA_BITWISE_MASK
        let _ = data_value(&mut bitwise, 5, &bits.to_ne_bytes()); // NFTA_BITWISE_XOR
        let mut set = Vec::new();
        put_u32(&mut set, 2, 3); // NFTA_META_KEY: mark
        put_u32(&mut set, 3, NFT_REG_1); // NFTA_META_SREG
        [Expr::meta_load(3), Expr { name: "bitwise", attrs: bitwise }, Expr { name: "meta", attrs: set }]
    }

    /// `dnat to ip:port`: the address and port into registers 1 and 2, then the NAT.
    pub(crate) fn dnat(ip: Ipv4Addr, port: u16) -> [Expr; 3] {
        let imm = |reg: u32, value: &[u8]| {
            let mut a = Vec::new();
            put_u32(&mut a, 1, reg); // NFTA_IMMEDIATE_DREG
            let _ = data_value(&mut a, 2, value); // NFTA_IMMEDIATE_DATA
            Expr { name: "immediate", attrs: a }
        };
        let mut nat = Vec::new();
        put_u32(&mut nat, 1, 1); // NFTA_NAT_TYPE: NFT_NAT_DNAT
        put_u32(&mut nat, 2, u32::from(NFPROTO_IPV4)); // NFTA_NAT_FAMILY
        put_u32(&mut nat, 3, NFT_REG_1); // NFTA_NAT_REG_ADDR_MIN
        put_u32(&mut nat, 5, NFT_REG_2); // NFTA_NAT_REG_PROTO_MIN
        put_u32(&mut nat, 7, 0x1 | 0x2); // NFTA_NAT_FLAGS: NF_NAT_RANGE_MAP_IPS | PROTO_SPECIFIED
        [imm(NFT_REG_1, &ip.octets()), imm(NFT_REG_2, &port.to_be_bytes()), Expr { name: "nat", attrs: nat }]
    }

    /// `goto chain`.
    pub(crate) fn goto(chain: &str) -> Result<Expr, NetlinkError> {
        let mut a = Vec::new();
        put_u32(&mut a, 1, NFT_REG_VERDICT); // NFTA_IMMEDIATE_DREG
        goto_verdict(&mut a, 2, chain)?; // NFTA_IMMEDIATE_DATA
        Ok(Expr { name: "immediate", attrs: a })
    }

    /// `numgen random mod modulus` into register 1.
    pub(crate) fn random_below(modulus: u32) -> Expr {
        let mut a = Vec::new();
        put_u32(&mut a, 1, NFT_REG_1); // NFTA_NG_DREG
        put_u32(&mut a, 2, modulus); // NFTA_NG_MODULUS
        put_u32(&mut a, 3, 1); // NFTA_NG_TYPE: NFT_NG_RANDOM
        put_u32(&mut a, 4, 0); // NFTA_NG_OFFSET
        Expr { name: "numgen", attrs: a }
    }

    /// `dnat to <register 1> map @map`: the address and port that data map `map` (an endpoint
    /// map, `add_endpoint_map`) gives for the key in register 1, as the destination.
    pub(crate) fn dnat_by_map(map: &str) -> Result<[Expr; 2], NetlinkError> {
        let mut lookup = Vec::new();
        put_name(&mut lookup, 1, map)?; // NFTA_LOOKUP_SET
        put_u32(&mut lookup, 2, NFT_REG_1); // NFTA_LOOKUP_SREG
        put_u32(&mut lookup, 3, NFT_REG_1); // NFTA_LOOKUP_DREG: address, then port
        let mut nat = Vec::new();
        put_u32(&mut nat, 1, 1); // NFTA_NAT_TYPE: NFT_NAT_DNAT
        put_u32(&mut nat, 2, u32::from(NFPROTO_IPV4)); // NFTA_NAT_FAMILY
        put_u32(&mut nat, 3, NFT_REG_1); // NFTA_NAT_REG_ADDR_MIN
        put_u32(&mut nat, 5, NFT_REG32_01); // NFTA_NAT_REG_PROTO_MIN: the 4 bytes after the address
        Ok([Expr { name: "lookup", attrs: lookup }, Expr { name: "nat", attrs: nat }])
    }

    /// Register 1 is in named set `set`, else the rule ends.
    pub(crate) fn in_set(set: &str) -> Result<Expr, NetlinkError> {
        let mut a = Vec::new();
        put_name(&mut a, 1, set)?; // NFTA_LOOKUP_SET
        put_u32(&mut a, 2, NFT_REG_1); // NFTA_LOOKUP_SREG
        Ok(Expr { name: "lookup", attrs: a })
    }

    /// `update @set { register 1 }`: adds the key, or renews its timeout.
    pub(crate) fn update_set(set: &str) -> Result<Expr, NetlinkError> {
        let mut a = Vec::new();
        put_name(&mut a, 1, set)?; // NFTA_DYNSET_SET_NAME
        put_u32(&mut a, 3, 1); // NFTA_DYNSET_OP: NFT_DYNSET_OP_UPDATE
        put_u32(&mut a, 4, NFT_REG_1); // NFTA_DYNSET_SREG_KEY
        Ok(Expr { name: "dynset", attrs: a })
    }
}

/// The messages of one transaction, with what each does (for the kernel's errors).
pub(crate) struct Batch {
    table: String,
    buf: Vec<u8>,
    /// What the message with sequence number `i + 2` does (1 is the batch's start).
    what: Vec<String>,
    next_set_id: u32,
}

impl Batch {
    pub(crate) fn new(table: &str) -> Batch {
        let mut b = Batch { table: table.to_string(), buf: Vec::new(), what: Vec::new(), next_set_id: 1 };
        b.header(NFNL_MSG_BATCH_BEGIN, 0, 1, 0, NFNL_SUBSYS_NFTABLES);
        b
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.what.is_empty()
    }

    /// `struct nlmsghdr` (its length filled in later) and `struct nfgenmsg`.
    fn header(&mut self, kind: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(&(libc::NLM_F_REQUEST as u16 | flags).to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&[family, 0]);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        self.finish(at);
        at
    }

    fn finish(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u32;
        self.buf[at..at + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// One nf_tables message whose attributes `fill` writes; nothing is added if it fails.
    fn message(
        &mut self,
        msg: u16,
        flags: u16,
        what: String,
        fill: impl FnOnce(&mut Vec<u8>) -> Result<(), NetlinkError>,
    ) -> Result<(), NetlinkError> {
        let mut attrs = Vec::new();
        fill(&mut attrs)?;
        let seq = self.what.len() as u32 + 2;
        let at = self.header((NFNL_SUBSYS_NFTABLES << 8) | msg, flags, seq, NFPROTO_IPV4, 0);
        self.buf.extend_from_slice(&attrs);
        self.finish(at);
        self.what.push(what);
        Ok(())
    }

    /// Adds chain `name` unless it is there.
    pub(crate) fn add_chain(&mut self, name: &str) -> Result<(), NetlinkError> {
        let t = self.table.clone();
        self.message(NFT_MSG_NEWCHAIN, libc::NLM_F_CREATE as u16, format!("add chain {name}"), |a| {
            put_name(a, NFTA_CHAIN_TABLE, &t)?;
            put_name(a, NFTA_CHAIN_NAME, name)
        })
    }

    /// Deletes every rule of chain `name`.
    pub(crate) fn flush_chain(&mut self, name: &str) -> Result<(), NetlinkError> {
        let t = self.table.clone();
        self.message(NFT_MSG_DELRULE, 0, format!("flush chain {name}"), |a| {
            put_name(a, NFTA_RULE_TABLE, &t)?;
            put_name(a, NFTA_RULE_CHAIN, name)
        })
    }

    pub(crate) fn delete_chain(&mut self, name: &str) -> Result<(), NetlinkError> {
        let t = self.table.clone();
        self.message(NFT_MSG_DELCHAIN, 0, format!("delete chain {name}"), |a| {
            put_name(a, NFTA_CHAIN_TABLE, &t)?;
            put_name(a, NFTA_CHAIN_NAME, name)
        })
    }

    pub(crate) fn delete_set(&mut self, name: &str) -> Result<(), NetlinkError> {
        let t = self.table.clone();
        self.message(NFT_MSG_DELSET, 0, format!("delete set {name}"), |a| {
            put_name(a, NFTA_SET_TABLE, &t)?;
            put_name(a, NFTA_SET_NAME, name)
        })
    }

    /// Appends a rule of `exprs` to chain `chain`.
    pub(crate) fn add_rule(&mut self, chain: &str, exprs: impl IntoIterator<Item = Expr>) -> Result<(), NetlinkError> {
        let t = self.table.clone();
        let flags = (libc::NLM_F_CREATE | libc::NLM_F_APPEND) as u16;
        self.message(NFT_MSG_NEWRULE, flags, format!("add a rule to chain {chain}"), |a| {
            put_name(a, NFTA_RULE_TABLE, &t)?;
            put_name(a, NFTA_RULE_CHAIN, chain)?;
            nest(a, NFTA_RULE_EXPRESSIONS, |list| {
                for e in exprs {
                    nest(list, NFTA_LIST_ELEM, |x| {
                        put_str(x, NFTA_EXPR_NAME, e.name)?;
                        put(x, NFTA_EXPR_DATA | NLA_F_NESTED, &e.attrs)
                    })?;
                }
                Ok(())
            })
        })
    }

    /// A set of source addresses that traffic fills, each forgotten `timeout_secs` after it was
    /// last seen (`flags dynamic,timeout`), unless it is there.
    pub(crate) fn add_timed_address_set(&mut self, name: &str, timeout_secs: u32) -> Result<(), NetlinkError> {
        let (t, id) = (self.table.clone(), self.next_set_id);
        self.next_set_id += 1;
        self.message(NFT_MSG_NEWSET, libc::NLM_F_CREATE as u16, format!("add set {name}"), |a| {
            put_name(a, NFTA_SET_TABLE, &t)?;
            put_name(a, NFTA_SET_NAME, name)?;
            put_u32(a, NFTA_SET_FLAGS, NFT_SET_TIMEOUT | NFT_SET_EVAL);
            put_u32(a, NFTA_SET_KEY_TYPE, NFT_TYPE_IPADDR);
            put_u32(a, NFTA_SET_KEY_LEN, 4);
            put(a, NFTA_SET_TIMEOUT, &(u64::from(timeout_secs) * 1000).to_be_bytes())?;
            put_u32(a, NFTA_SET_ID, id);
            Ok(())
        })
    }

    /// `numgen random mod N vmap { 0 : goto targets[0], ... }` as a rule of `chain`: an
    /// anonymous constant map filled in this transaction and bound by the rule.
    pub(crate) fn add_random_pick(&mut self, chain: &str, targets: &[String]) -> Result<(), NetlinkError> {
        let (t, id) = (self.table.clone(), self.next_set_id);
        self.next_set_id += 1;
        let anon = "__map%d";
        self.message(NFT_MSG_NEWSET, libc::NLM_F_CREATE as u16, format!("add the endpoint map of chain {chain}"), |a| {
            put_name(a, NFTA_SET_TABLE, &t)?;
            put_name(a, NFTA_SET_NAME, anon)?;
            put_u32(a, NFTA_SET_FLAGS, NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | NFT_SET_MAP);
            put_u32(a, NFTA_SET_KEY_TYPE, NFT_TYPE_INTEGER);
            put_u32(a, NFTA_SET_KEY_LEN, 4);
            put_u32(a, NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
            put_u32(a, NFTA_SET_ID, id);
            // nft's own note of the key's byte order (NFTNL_UDATA_SET_KEYBYTEORDER: host), so
            // that it lists the keys as the numbers they are.
            let mut udata = vec![0u8, 4];
            udata.extend_from_slice(&1u32.to_ne_bytes());
            put(a, NFTA_SET_USERDATA, &udata)
        })?;
        let keys: Vec<[u8; 4]> = (0..targets.len()).map(|i| u32::try_from(i).unwrap_or(u32::MAX).to_ne_bytes()).collect();
        let elements: Vec<(&[u8], Data)> = keys.iter().zip(targets).map(|(k, c)| (k.as_slice(), Data::Goto(c))).collect();
        self.elements(NFT_MSG_NEWSETELEM, anon, Some(id), &elements)?;
        let modulus = u32::try_from(targets.len()).map_err(|_| NetlinkError::TooLarge(targets.len()))?;
        let mut numgen = Vec::new();
        put_u32(&mut numgen, 1, NFT_REG_1); // NFTA_NG_DREG
        put_u32(&mut numgen, 2, modulus); // NFTA_NG_MODULUS
        put_u32(&mut numgen, 3, 1); // NFTA_NG_TYPE: NFT_NG_RANDOM
        let mut lookup = Vec::new();
        put_name(&mut lookup, 1, anon)?; // NFTA_LOOKUP_SET
        put_u32(&mut lookup, 2, NFT_REG_1); // NFTA_LOOKUP_SREG
        put_u32(&mut lookup, 3, NFT_REG_VERDICT); // NFTA_LOOKUP_DREG
        put_u32(&mut lookup, 4, id); // NFTA_LOOKUP_SET_ID
        self.add_rule(chain, [Expr { name: "numgen", attrs: numgen }, Expr { name: "lookup", attrs: lookup }])
    }

    /// Adds `key : goto chain` elements to verdict map `map`.
    pub(crate) fn add_map_elements(&mut self, map: &str, elements: &[(Vec<u8>, &str)]) -> Result<(), NetlinkError> {
        let elements: Vec<(&[u8], Data)> = elements.iter().map(|(k, c)| (k.as_slice(), Data::Goto(c))).collect();
        self.elements(NFT_MSG_NEWSETELEM, map, None, &elements)
    }

    /// Deletes the elements of these keys from map (or set) `map`.
    pub(crate) fn delete_map_elements(&mut self, map: &str, keys: &[Vec<u8>]) -> Result<(), NetlinkError> {
        let elements: Vec<(&[u8], Data)> = keys.iter().map(|k| (k.as_slice(), Data::None)).collect();
        self.elements(NFT_MSG_DELSETELEM, map, None, &elements)
    }

    /// Adds the elements of these keys to set `set`.
    pub(crate) fn add_set_elements(&mut self, set: &str, keys: &[Vec<u8>]) -> Result<(), NetlinkError> {
        let elements: Vec<(&[u8], Data)> = keys.iter().map(|k| (k.as_slice(), Data::None)).collect();
        self.elements(NFT_MSG_NEWSETELEM, set, None, &elements)
    }

    /// Adds `key : value` elements to data map `map`.
    pub(crate) fn add_data_elements(&mut self, map: &str, elements: &[(Vec<u8>, Vec<u8>)]) -> Result<(), NetlinkError> {
        let elements: Vec<(&[u8], Data)> = elements.iter().map(|(k, v)| (k.as_slice(), Data::Value(v))).collect();
        self.elements(NFT_MSG_NEWSETELEM, map, None, &elements)
    }

    /// Deletes every element of set or map `name`.
    pub(crate) fn flush_set(&mut self, name: &str) -> Result<(), NetlinkError> {
        let t = self.table.clone();
        self.message(NFT_MSG_DELSETELEM, 0, format!("flush map {name}"), |a| {
            put_name(a, NFTA_SET_ELEM_LIST_TABLE, &t)?;
            put_name(a, NFTA_SET_ELEM_LIST_SET, name)
        })
    }

    /// A map from an endpoint's number to its address and port (`typeof numgen random mod 1 :
    /// ip daddr . tcp dport`, or udp, sctp: `protocol`), unless it is there: what
    /// `Expr::dnat_by_map` looks up. (nft refuses, for rules of `meta l4proto tcp`, a map of
    /// `th dport` that it reads back from the kernel.)
    pub(crate) fn add_endpoint_map(&mut self, name: &str, protocol: &str) -> Result<(), NetlinkError> {
        let mut userdata = ENDPOINT_MAP_USERDATA;
        userdata[ENDPOINT_MAP_PROTOCOL] = match protocol {
            "udp" => 6,
            "sctp" => 10,
            _ => 8,
        };
        let (t, id) = (self.table.clone(), self.next_set_id);
        self.next_set_id += 1;
        self.message(NFT_MSG_NEWSET, libc::NLM_F_CREATE as u16, format!("add map {name}"), |a| {
            put_name(a, NFTA_SET_TABLE, &t)?;
            put_name(a, NFTA_SET_NAME, name)?;
            put_u32(a, NFTA_SET_FLAGS, NFT_SET_MAP);
            put_u32(a, NFTA_SET_KEY_TYPE, NFT_TYPE_INTEGER);
            put_u32(a, NFTA_SET_KEY_LEN, 4);
            put_u32(a, NFTA_SET_DATA_TYPE, NFT_TYPE_ADDR_SERVICE);
            put_u32(a, NFTA_SET_DATA_LEN, 8);
            put_u32(a, NFTA_SET_ID, id);
            put(a, NFTA_SET_USERDATA, &userdata)
        })
    }

    /// Element messages for set `set` (`id` if it is new in this transaction).
    fn elements(&mut self, msg: u16, set: &str, id: Option<u32>, elements: &[(&[u8], Data)]) -> Result<(), NetlinkError> {
        let verb = if msg == NFT_MSG_NEWSETELEM { "add" } else { "delete" };
        for chunk in elements.chunks(ELEMENTS_PER_MESSAGE) {
            let t = self.table.clone();
            let flags = if msg == NFT_MSG_NEWSETELEM { libc::NLM_F_CREATE as u16 } else { 0 };
            self.message(msg, flags, format!("{verb} {} elements of map {set}", chunk.len()), |a| {
                put_name(a, NFTA_SET_ELEM_LIST_TABLE, &t)?;
                put_name(a, NFTA_SET_ELEM_LIST_SET, set)?;
                if let Some(id) = id {
                    put_u32(a, NFTA_SET_ELEM_LIST_SET_ID, id);
                }
                nest(a, NFTA_SET_ELEM_LIST_ELEMENTS, |list| {
                    for (key, data) in chunk {
                        nest(list, NFTA_LIST_ELEM, |e| {
                            data_value(e, NFTA_SET_ELEM_KEY, key)?;
                            match data {
                                Data::None => Ok(()),
                                Data::Goto(chain) => goto_verdict(e, NFTA_SET_ELEM_DATA, chain),
                                Data::Value(v) => data_value(e, NFTA_SET_ELEM_DATA, v),
                            }
                        })?;
                    }
                    Ok(())
                })
            })?;
        }
        Ok(())
    }

    /// The whole transaction as sent.
    fn bytes(mut self) -> Vec<u8> {
        let seq = self.what.len() as u32 + 2;
        self.header(NFNL_MSG_BATCH_END, 0, seq, 0, NFNL_SUBSYS_NFTABLES);
        self.buf
    }

    /// Commits the transaction: all of it, or (with an error naming the first message the kernel
    /// refused) none of it.
    pub(crate) fn commit(mut self) -> Result<(), NetlinkError> {
        if self.is_empty() {
            return Ok(());
        }
        // The last change asks for an acknowledgement: an answer that it came through, where an
        // error would come for any message refused. The kernel handles the whole batch within
        // the send, so every answer is queued when it returns.
        let last = self.what.len() as u32 + 1;
        if let Some(at) = self.last_message_offset() {
            let flags = u16::from_ne_bytes([self.buf[at + 6], self.buf[at + 7]]) | libc::NLM_F_ACK as u16;
            self.buf[at + 6..at + 8].copy_from_slice(&flags.to_ne_bytes());
        }
        let what = std::mem::take(&mut self.what);
        let bytes = self.bytes();
        let fd = socket()?;
        let len = bytes.len();
        if len + 4096 > 200 * 1024 {
            let size = libc::c_int::try_from(len + 4096).map_err(|_| NetlinkError::TooLarge(len))?;
            // SAFETY: setsockopt reads one c_int, which `size` is.
            let r = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_SNDBUFFORCE,
                    (&raw const size).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if r != 0 {
                return Err(NetlinkError::TooLarge(len));
            }
        }
        // SAFETY: send reads `bytes.len()` bytes of `bytes`.
        let sent = unsafe { libc::send(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
        if sent < 0 {
            let e = std::io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EMSGSIZE) { NetlinkError::TooLarge(len) } else { NetlinkError::Socket(e) });
        }
        let mut answer = vec![0u8; 64 * 1024];
        let mut confirmed = false;
        loop {
            // SAFETY: recv writes at most `answer.len()` bytes into `answer`.
            let got = unsafe { libc::recv(fd.as_raw_fd(), answer.as_mut_ptr().cast(), answer.len(), libc::MSG_DONTWAIT) };
            let Some(got) = usize::try_from(got).ok().filter(|&n| n > 0) else { break };
            let mut msgs = answer.get(..got).unwrap_or_default();
            while msgs.len() >= 16 {
                let mlen = u32::from_ne_bytes([msgs[0], msgs[1], msgs[2], msgs[3]]) as usize;
                let kind = u16::from_ne_bytes([msgs[4], msgs[5]]);
                let seq = u32::from_ne_bytes([msgs[8], msgs[9], msgs[10], msgs[11]]);
                if kind == libc::NLMSG_ERROR as u16 && msgs.len() >= 20 {
                    let errno = i32::from_ne_bytes([msgs[16], msgs[17], msgs[18], msgs[19]]);
                    if errno != 0 {
                        let step = seq.checked_sub(2).and_then(|i| what.get(i as usize));
                        let what = step.cloned().unwrap_or_else(|| "commit the nftables transaction".to_string());
                        return Err(NetlinkError::Refused { what, error: std::io::Error::from_raw_os_error(-errno) });
                    }
                    confirmed |= seq == last;
                }
                if mlen < 16 {
                    break;
                }
                msgs = msgs.get(mlen.next_multiple_of(4)..).unwrap_or_default();
            }
        }
        if confirmed { Ok(()) } else { Err(NetlinkError::Unconfirmed) }
    }

    fn last_message_offset(&self) -> Option<usize> {
        let mut at = 0;
        let mut last = None;
        while at + 16 <= self.buf.len() {
            let len = u32::from_ne_bytes(self.buf[at..at + 4].try_into().ok()?) as usize;
            if len < 16 {
                return None;
            }
            last = Some(at);
            at += len.next_multiple_of(4);
        }
        last.filter(|&l| l != 0)
    }
}

fn socket() -> Result<OwnedFd, NetlinkError> {
    // SAFETY: socket has no memory preconditions; the descriptor it returns is owned below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_NETFILTER) };
    if fd < 0 {
        return Err(NetlinkError::Socket(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The key of a `ipv4_addr . inet_proto . inet_service` element: each field in 4 bytes.
pub(crate) fn ip_proto_port_key(ip: Ipv4Addr, proto: u8, port: u16) -> Vec<u8> {
    let mut k = ip.octets().to_vec();
    k.extend_from_slice(&[proto, 0, 0, 0]);
    k.extend_from_slice(&port.to_be_bytes());
    k.extend_from_slice(&[0, 0]);
    k
}

/// The key of an endpoint map's element: the endpoint's number, as numgen gives it (host order).
pub(crate) fn endpoint_number_key(i: usize) -> Vec<u8> {
    u32::try_from(i).unwrap_or(u32::MAX).to_ne_bytes().to_vec()
}

/// The value of an endpoint map's element: the address, then the port in 4 bytes.
pub(crate) fn address_port(ip: Ipv4Addr, port: u16) -> Vec<u8> {
    let mut v = ip.octets().to_vec();
    v.extend_from_slice(&port.to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    v
}

/// The key of a `ipv4_addr . ipv4_addr` element.
pub(crate) fn address_pair(a: Ipv4Addr, b: Ipv4Addr) -> Vec<u8> {
    let mut k = a.octets().to_vec();
    k.extend_from_slice(&b.octets());
    k
}

/// The key of a `inet_proto . inet_service` element.
pub(crate) fn proto_port_key(proto: u8, port: u16) -> Vec<u8> {
    let mut k = vec![proto, 0, 0, 0];
    k.extend_from_slice(&port.to_be_bytes());
    k.extend_from_slice(&[0, 0]);
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_longer_than_the_kernel_takes_is_an_error_that_names_it_and_adds_nothing() {
        let mut b = Batch::new("shepherd");
        let long = format!("ep-default-{}-tcp-80-10.244.0.2-8080", "a".repeat(253));
        let e = b.add_chain(&long).expect_err("too long");
        assert!(e.to_string().contains(&long) && e.to_string().contains("255"), "{e}");
        assert!(b.is_empty(), "a refused change adds no message");
        b.add_chain("ep-default-web-tcp-80-10.244.0.2-8080").expect("a name that fits");
        assert!(!b.is_empty());
    }

    #[test]
    fn an_attribute_over_64_kib_is_an_error_not_a_wrapped_length() {
        let mut buf = Vec::new();
        let e = put(&mut buf, NFTA_DATA_VALUE, &vec![0u8; 70_000]).expect_err("too long");
        assert!(matches!(e, NetlinkError::AttributeTooLong(70_004)), "{e}");
        assert!(buf.is_empty());
    }

    #[test]
    fn a_batch_is_framed_by_begin_and_end_with_lengths_that_add_up() {
        let mut b = Batch::new("shepherd");
        b.add_chain("c").expect("chain");
        b.add_rule("c", Expr::dnat("10.244.0.2".parse().unwrap(), 8080)).expect("rule");
        let bytes = b.bytes();
        let mut at = 0;
        let mut kinds = Vec::new();
        while at < bytes.len() {
            let len = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            kinds.push(u16::from_ne_bytes(bytes[at + 4..at + 6].try_into().unwrap()));
            at += len;
        }
        assert_eq!(at, bytes.len());
        let nft = |m: u16| (NFNL_SUBSYS_NFTABLES << 8) | m;
        assert_eq!(kinds, [NFNL_MSG_BATCH_BEGIN, nft(NFT_MSG_NEWCHAIN), nft(NFT_MSG_NEWRULE), NFNL_MSG_BATCH_END]);
    }
}
