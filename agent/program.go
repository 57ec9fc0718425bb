package agent

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"kuport.wlz.li/kuport/datapath"
	kuportv1 "kuport.wlz.li/kuport/proto/kuport/v1"
)

// handleProgram applies p when it must and returns the Ack to send. A program whose epoch is
// lower than the highest this agent, or per Config.EpochFile an earlier agent on this node,
// applied (a deposed leader's, proto/kuport/v1/program.proto, NodeProgram.epoch) is not
// applied: its Ack carries one error saying it was fenced.
//
// A program whose content (everything but version and epoch) equals the current program's,
// which applied without errors, is acknowledged without calling Apply: the kernel already
// holds it (a reconnect resends the same program). Any other program is applied, including
// one of equal epoch and lower version whose content differs. A program Config.Validate
// rejects is refused whole before that, and the current program stays current.
func (a *Agent) handleProgram(p *kuportv1.NodeProgram) *kuportv1.Ack {
	if p.GetNode() != a.cfg.NodeName {
		a.log.Error("refusing a program for another node", "program_node", p.GetNode(), "version", p.GetVersion(), "epoch", p.GetEpoch())
		return &kuportv1.Ack{Version: p.GetVersion(), Epoch: p.GetEpoch(), Errors: []*kuportv1.EntryError{{
			Message: fmt.Sprintf("program is for node %q, this agent is node %q", p.GetNode(), a.cfg.NodeName),
		}}}
	}
	cur := a.current
	if p.GetEpoch() < a.epochFloor {
		a.log.Warn("refusing a program from a lower epoch (fencing)",
			"version", p.GetVersion(), "epoch", p.GetEpoch(), "applied_epoch", a.epochFloor)
		// Say so, so the sender's status shows why the node does not follow it.
		return &kuportv1.Ack{Version: p.GetVersion(), Epoch: p.GetEpoch(), Errors: []*kuportv1.EntryError{{
			Message: fmt.Sprintf("refused by fencing: program epoch %d is lower than the applied epoch %d", p.GetEpoch(), a.epochFloor),
		}}}
	}
	if a.cfg.Validate != nil {
		start := time.Now()
		err := a.cfg.Validate(p)
		a.log.Debug("program validated", "version", p.GetVersion(), "validate_us", time.Since(start).Microseconds())
		if err != nil {
			// Refused whole: the kernel keeps the current program, which stays current.
			errs := a.entryErrors(err)
			a.log.Error("refusing an invalid program", "version", p.GetVersion(), "epoch", p.GetEpoch(),
				"entry_errors", len(errs), "error", err)
			return &kuportv1.Ack{Version: p.GetVersion(), Epoch: p.GetEpoch(), Errors: errs}
		}
	}
	if cur != nil && len(a.currentErr) == 0 && datapath.SameProgram(p, cur) {
		a.log.Debug("program content already applied, acknowledging",
			"version", p.GetVersion(), "epoch", p.GetEpoch(), "applied_version", cur.GetVersion(), "applied_epoch", cur.GetEpoch())
		if p.GetEpoch() > cur.GetEpoch() || p.GetVersion() > cur.GetVersion() {
			a.setCurrent(p, nil)
		}
		return &kuportv1.Ack{Version: p.GetVersion(), Epoch: p.GetEpoch()}
	}
	ack := a.apply(p)
	if a.cfg.Applied != nil {
		go a.cfg.Applied()
	}
	return ack
}

// resync applies the current program again, retrying a failed Apply and repairing kernel
// state others removed. It returns an Ack when the outcome is worth telling the controller
// (the previous or this attempt had errors), else nil.
func (a *Agent) resync() *kuportv1.Ack {
	if a.current == nil {
		return nil
	}
	hadErrors := len(a.currentErr) > 0
	a.log.Debug("resync", "version", a.current.GetVersion(), "epoch", a.current.GetEpoch())
	ack := a.apply(a.current)
	if !hadErrors && len(ack.Errors) == 0 {
		return nil
	}
	return ack
}

// apply calls Datapath.Apply, records p as current whatever the outcome (the kernel now holds
// it, at least in part, and resync retries it) and returns its Ack.
func (a *Agent) apply(p *kuportv1.NodeProgram) *kuportv1.Ack {
	if a.log.IsTrace() {
		a.log.Trace("applying program", "program", protojson.Format(p))
	}
	ack := &kuportv1.Ack{Version: p.GetVersion(), Epoch: p.GetEpoch()}
	if err := a.cfg.Datapath.Apply(p); err != nil {
		ack.Errors = a.entryErrors(err)
		a.setCurrent(p, ack.Errors)
		a.log.Error("program apply failed", "version", p.GetVersion(), "epoch", p.GetEpoch(), "entry_errors", len(ack.Errors), "error", err)
		return ack
	}
	a.setCurrent(p, nil)
	a.log.Info("program applied", "version", p.GetVersion(), "epoch", p.GetEpoch(),
		"dnat_rules", len(p.GetDnatRules()), "snat_rules", len(p.GetSnatRules()), "mark_rules", len(p.GetMarkRules()),
		"links", len(p.GetLinks()), "return_paths", len(p.GetReturnPaths()))
	return ack
}

// entryErrors turns an Apply error into EntryErrors (Config.EntryErrors), falling back to one
// entry with an empty id.
func (a *Agent) entryErrors(err error) []*kuportv1.EntryError {
	if a.cfg.EntryErrors != nil {
		if errs := a.cfg.EntryErrors(err); len(errs) > 0 {
			return errs
		}
	}
	return []*kuportv1.EntryError{{Message: err.Error()}}
}

// setCurrent records p as the program the kernel holds, with errs (nil when whole), raises
// the fencing floor to its epoch, and publishes it to GetAppliedProgram stamped with the
// current time.
func (a *Agent) setCurrent(p *kuportv1.NodeProgram, errs []*kuportv1.EntryError) {
	a.current, a.currentErr = p, errs
	a.raiseEpochFloor(p.GetEpoch())
	a.applied.Store(&kuportv1.GetAppliedProgramResponse{Program: p, Errors: errs, ApplyTime: timestamppb.Now()})
}
