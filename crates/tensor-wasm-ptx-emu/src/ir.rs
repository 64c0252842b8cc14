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
    /// `%laneid`: the thread's lane in its warp.
    LaneId,
    /// `%warpsize`: 32.
    WarpSize,
}

/// A source operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Src {
    Reg(u16),
    Imm(u64),
    Special(Special),
    /// A `.local` variable's address: the frame's base in the thread's local memory plus
    /// this offset.
    Local(u32),
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
    /// The entry's parameters (read-only).
    Param,
    /// The current call frame's parameter space: a `.func`'s parameters and return value,
    /// and the `.param` variables a body declares for the calls it makes.
    Frame,
    /// The thread's local memory (its call stack of `.local` variables).
    Local,
    /// A generic address: the shared or local window, else global.
    Generic,
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

/// Float binary operations (f32 or f64), rounded to nearest even.
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

/// Atomic read-modify-write operations (`atom`, `red`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtomOp {
    Add,
    Min,
    Max,
    Inc,
    Dec,
    And,
    Or,
    Xor,
    Exch,
    Cas,
}

/// The lane a `shfl.sync` reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShflMode {
    Up,
    Down,
    Bfly,
    Idx,
}

/// Logic on predicates (`and.pred`, ..., `not.pred`, `mov.pred`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PredOp {
    And,
    Or,
    Xor,
    Not,
    Mov,
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
    /// f32 or f64 (`bits`); `ftz` flushes subnormal inputs and results to signed zeros.
    Float {
        op: FloatOp,
        bits: u32,
        ftz: bool,
        dst: u16,
        a: Src,
        b: Src,
    },
    /// `sqrt.rn`: the correctly rounded square root.
    Sqrt {
        bits: u32,
        ftz: bool,
        dst: u16,
        a: Src,
    },
    /// `fma.rn`: one rounding.
    Fma {
        bits: u32,
        ftz: bool,
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
        ftz: bool,
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
    /// `atom` (a result) or `red` (`dst` is `None`); `c` is `cas`'s new value.
    Atom {
        op: AtomOp,
        space: Space,
        ty: Ty,
        dst: Option<u16>,
        addr: Addr,
        b: Src,
        c: Option<Src>,
    },
    /// `cvta.SPACE` (`to` false: a space's address to a generic one) or `cvta.to.SPACE`.
    Cvta {
        space: Space,
        to: bool,
        dst: u16,
        src: Src,
    },
    /// `isspacep.SPACE`: whether a generic address lies in `space`.
    IsSpace {
        space: Space,
        dst: u16,
        a: Src,
    },
    PredLogic {
        op: PredOp,
        dst: u16,
        a: Pred,
        b: Option<Pred>,
    },
    /// `shfl.sync`: `dst` (and `pred`) from lane `b`'s relative, `c` the clamp and segment
    /// mask, `mask` the lanes taking part.
    Shfl {
        mode: ShflMode,
        dst: u16,
        pred: Option<u16>,
        a: Src,
        b: Src,
        c: Src,
        mask: Src,
    },
    /// A call of function `func` of the module: each argument is a `.param` variable of the
    /// caller's frame (byte offset), `ret` the variable that receives the return value.
    Call {
        func: u32,
        args: Vec<u32>,
        ret: Option<u32>,
    },
    Bra {
        target: u32,
    },
    Bar,
    /// `ret`: the end of a function (of the thread, in the entry).
    Ret,
    /// `exit`: the end of the thread, from any depth of calls.
    Exit,
}

/// One instruction: an optional guard predicate, the operation, its source line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Instr {
    pub guard: Option<Pred>,
    pub op: Op,
    pub line: u32,
}
