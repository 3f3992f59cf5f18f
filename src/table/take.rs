//! What the table takes of a row for a reserve: a plain debit ([`Debit`])
//! or a hold ([`Hold`]). A kind of take is the decision alone, from the
//! rules (`crate::rule`, through `Limits` and `held`): given a row's
//! settled state, or a fresh row's floor, it says what the row becomes and
//! what was taken. The table finds the row, applies the decision with one
//! CAS and decides again on the value a lost CAS found; it knows nothing
//! of the decision itself. (Its fast paths, a plain row's debit and a
//! hold worked on the row's word, are the same decisions on the row's
//! word: `Table::debit`, `Form::hold_word`.)

use super::held::{Form, Held};
use super::Taken;
use crate::bucket::{Decision, Limits};

/// A kind of take: the decision on a row's state and on a fresh row.
pub(crate) trait Take: Copy {
    /// Whether the tokens are held in a lot rather than debited.
    const HOLD: bool;

    /// The take of `n` tokens at reading `now` (whose epoch is `e`) from a
    /// row whose settled state is `was`: the row's next state and what was
    /// taken.
    fn on_state(
        was: Held,
        limits: &Limits,
        now: u64,
        e: u64,
        n: u64,
        form: &Form,
    ) -> Result<(Held, Taken), Decision>;

    /// The take of `n` tokens at `now` from a fresh row that starts from
    /// `floor`: the row's `tat` field (a record's address is the caller's
    /// until a CAS publishes it) and what was taken.
    fn on_fresh(
        floor: u64,
        limits: &Limits,
        now: u64,
        n: u64,
        form: &Form,
    ) -> Result<(u64, Taken), Decision>;
}

/// A plain debit (a reserve, a turn): the settled `tat` moves on by the
/// tokens' cost, beside the tokens held on the row.
#[derive(Clone, Copy)]
pub(crate) struct Debit;

/// A hold: the tokens' cost joins the current lot, and the ticket names it.
#[derive(Clone, Copy)]
pub(crate) struct Hold;

impl Take for Debit {
    const HOLD: bool = false;

    #[inline(always)]
    fn on_state(
        was: Held,
        limits: &Limits,
        now: u64,
        _e: u64,
        n: u64,
        _form: &Form,
    ) -> Result<(Held, Taken), Decision> {
        let next = was.debit(limits, now, n)?;
        Ok((
            next,
            Taken::Debit {
                tat: next.tat,
                prev: was.tat,
            },
        ))
    }

    #[inline(always)]
    fn on_fresh(
        floor: u64,
        limits: &Limits,
        now: u64,
        n: u64,
        _form: &Form,
    ) -> Result<(u64, Taken), Decision> {
        match limits.reserve(floor, now, n) {
            Decision::Admit(tat) => Ok((tat, Taken::Debit { tat, prev: floor })),
            denied => Err(denied),
        }
    }
}

impl Take for Hold {
    const HOLD: bool = true;

    #[inline(always)]
    fn on_state(
        was: Held,
        limits: &Limits,
        now: u64,
        e: u64,
        n: u64,
        form: &Form,
    ) -> Result<(Held, Taken), Decision> {
        let (next, ticket) = was.hold_at_epoch(limits, now, e, n, form)?;
        Ok((next, Taken::Hold(ticket)))
    }

    #[inline(always)]
    fn on_fresh(
        floor: u64,
        limits: &Limits,
        now: u64,
        n: u64,
        form: &Form,
    ) -> Result<(u64, Taken), Decision> {
        let (state, ticket) = Held::plain(floor).hold(limits, now, n, form)?;
        Ok((state.publish(form), Taken::Hold(ticket)))
    }
}
