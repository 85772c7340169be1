package server

import (
	"context"
	"strings"

	"github.com/kefirdb/kefir/internal/cluster"
)

// KEFIR.SLOTS: the steps of a slot move, each at one group's leader
// (docs/design/cluster.md; the mover, cluster.Mover, drives them). The
// subcommands and their replies are cluster.SlotsCommand's (slotscmd.go),
// the one translation the simulated mover runs too; here a write's op is
// proposed at the node's replica of the group (Multi.SlotWrite), which
// answers -MOVED <leader's address> (or -UNAVAILABLE no leader) where it does
// not lead: the mover follows it, as the steps are not forwarded.
func (c *conn) slotsCmd(args [][]byte) error {
	m := c.srv.multi
	if m == nil {
		return errf("ERR KEFIR.SLOTS needs a node of several groups (--groups)")
	}
	if strings.EqualFold(string(args[1]), "META") {
		return c.metaCmd(args) // meta.go
	}
	cmd, err := cluster.SlotsCommand(m, args)
	if err != nil {
		return err
	}
	if !cmd.Write {
		return c.w.WriteValue(cmd.Reply)
	}
	res, err := m.SlotWrite(context.Background(), cmd.Group, cmd.Op)
	if err != nil {
		return err
	}
	return c.w.WriteValue(cmd.WriteReply(res))
}
