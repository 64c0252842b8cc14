//! The decoded form of a kernel's instructions: registers as indices, labels as instruction
//! indices, symbols as byte offsets, so execution does no name lookups.

/// A scalar type of an instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ty {
    pub kind: TyKind,
    /// Width in bits: 8, 16, 32 or 64.
    pub bits: u32,
}

/// The kind of a scalar type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TyKind {
    /// `.b` bits.
    B,
    /// `.u` unsigned.
    U,
    /// `.s` signed.
    S,
    /// `.f` floating point.
    F,
}

impl Ty {
    /// Parses `b32`, `u64`, `s16`, `f32`, ... (without the dot).
    pub fn parse(text: &str) -> Option<Ty> {
        let kind = match text.as_bytes().first()? {
            b'b' => TyKind::B,
            b'u' => TyKind::U,
            b's' => TyKind::S,
            b'f' => TyKind::F,
            _ => return None,
        };
        let bits: u32 = text[1..].parse().ok()?;
        let valid = match kind {
            TyKind::F => matches!(bits, 32 | 64),
            _ => matches!(bits, 8 | 16 | 32 | 64),
        };
        valid.then_some(Ty { kind, bits })
    }

    pub fn signed(self) -> bool {
        self.kind == TyKind::S
    }

    pub fn bytes(self) -> u32 {
        self.bits / 8
    }
}

/// A special register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Special {
    Tid(usize),
    Ntid(usize),
    Ctaid(usize),
    Nctaid(usize),
}

/// A source operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Src {
    Reg(u16),
    Imm(u64),
    Special(Special),
}

/// A predicate operand: register index and whether it is negated (`!%p`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pred {
    pub reg: u16,
    pub negated: bool,
}

/// A state space of a memory access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    Global,
    Shared,
    Param,
}

/// `[base + offset]`; symbols are already folded into `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Addr {
    pub base: Option<u16>,
    pub offset: i64,
}

/// Integer binary operations (`.lo` for `mul`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IntOp {
    Add,
    Sub,
    MulLo,
    MulHi,
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

/// f32 binary operations, rounded to nearest even.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloatOp {
    Add,
    Sub,
    Mul,
    Div,
    Min,
    Max,
}

/// Unary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnaryOp {
    Neg,
    Abs,
    Not,
}

/// `setp` comparisons (the unordered float forms end in `u`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Equ,
    Neu,
    Ltu,
    Leu,
    Gtu,
    Geu,
    Num,
    Nan,
}

impl Cmp {
    pub fn parse(text: &str) -> Option<Cmp> {
        Some(match text {
            "eq" => Cmp::Eq,
            "ne" => Cmp::Ne,
            "lt" | "lo" => Cmp::Lt,
            "le" | "ls" => Cmp::Le,
            "gt" | "hi" => Cmp::Gt,
            "ge" | "hs" => Cmp::Ge,
            "equ" => Cmp::Equ,
            "neu" => Cmp::Neu,
            "ltu" => Cmp::Ltu,
            "leu" => Cmp::Leu,
            "gtu" => Cmp::Gtu,
            "geu" => Cmp::Geu,
            "num" => Cmp::Num,
            "nan" => Cmp::Nan,
            _ => return None,
        })
    }
}

/// How `setp` combines its comparison with a third predicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BoolOp {
    And,
    Or,
    Xor,
}

/// Rounding of a `cvt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rounding {
    /// `.rn`: to nearest even (float results).
    Rn,
    /// `.rni`, `.rzi`, `.rmi`, `.rpi`: to an integral value.
    Rni,
    Rzi,
    Rmi,
    Rpi,
}

/// One decoded operation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Op {
    /// `mov` (and `cvta.to.global`, an identity here): `bits` wide.
    Mov {
        bits: u32,
        dst: u16,
        src: Src,
    },
    Int {
        op: IntOp,
        ty: Ty,
        dst: u16,
        a: Src,
        b: Src,
    },
    /// `mul.wide`: `ty` is the source type; the result is twice as wide.
    MulWide {
        ty: Ty,
        dst: u16,
        a: Src,
        b: Src,
    },
    /// `mad.lo`: `a * b + c`, wrapping.
    MadLo {
        ty: Ty,
        dst: u16,
        a: Src,
        b: Src,
        c: Src,
    },
    Float {
        op: FloatOp,
        dst: u16,
        a: Src,
        b: Src,
    },
    /// `sqrt.rn.f32`: the correctly rounded square root.
    Sqrt {
        dst: u16,
        a: Src,
    },
    /// `fma.rn.f32`: one rounding.
    Fma {
        dst: u16,
        a: Src,
        b: Src,
        c: Src,
    },
    Unary {
        op: UnaryOp,
        ty: Ty,
        dst: u16,
        a: Src,
    },
    Setp {
        cmp: Cmp,
        ty: Ty,
        dst: u16,
        a: Src,
        b: Src,
        combine: Option<(BoolOp, Pred)>,
    },
    Selp {
        bits: u32,
        dst: u16,
        a: Src,
        b: Src,
        pred: Pred,
    },
    Cvt {
        dst_ty: Ty,
        src_ty: Ty,
        rounding: Option<Rounding>,
        sat: bool,
        dst: u16,
        src: Src,
    },
    Ld {
        space: Space,
        ty: Ty,
        dsts: Vec<u16>,
        addr: Addr,
    },
    St {
        space: Space,
        ty: Ty,
        srcs: Vec<Src>,
        addr: Addr,
    },
    Bra {
        target: u32,
    },
    Bar,
    Exit,
}

/// One instruction: an optional guard predicate, the operation, its source line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Instr {
    pub guard: Option<Pred>,
    pub op: Op,
    pub line: u32,
}
