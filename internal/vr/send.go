package vr

import (
	"fmt"
	"slices"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Outgoing messages: stamping, sending (now or after an fsync), broadcast,
// log batches, and the identity check every incoming message passes.

func (r *Replica) stamp(m *Message, to uint64) {
	m.Cluster, m.Epoch, m.ConfigHash = r.cfg.Cluster, r.cfg.Epoch, r.hash
	m.From, m.To = r.cfg.Self, to
}

func (r *Replica) send(to uint64, m Message) {
	r.stamp(&m, to)
	r.out.Messages = append(r.out.Messages, m)
}

// sendAfterSync sends m once the batch now being built is durable.
func (r *Replica) sendAfterSync(to uint64, m Message) {
	r.stamp(&m, to)
	if mutation.On && r.mut.ackBeforePersist {
		r.out.Messages = append(r.out.Messages, m)
		return
	}
	r.defers = append(r.defers, deferred{seq: r.nextSeq(), m: m})
}

func (r *Replica) broadcast(m Message, afterSync bool) {
	for i, id := range r.cfg.Members {
		if i == r.self {
			continue
		}
		if afterSync {
			r.sendAfterSync(id, m)
		} else {
			r.send(id, m)
		}
	}
}

func (r *Replica) copyLog(from uint64, limit int) []Entry {
	if from < r.first {
		from = r.first
	}
	if from > r.lastOp() {
		return nil
	}
	es := r.log[from-r.first:]
	if limit > 0 {
		es = es[:min(len(es), limit)]
		es = es[:batchLen(es, 4*r.cfg.MaxBatchBytes)]
	}
	return append([]Entry(nil), es...)
}

// batchLen is how many of es, at least one, fit in maxBytes of request data.
func batchLen(es []Entry, maxBytes int) int {
	n, size := 0, 0
	for n < len(es) {
		size += len(es[n].Data)
		if n > 0 && size > maxBytes {
			break
		}
		n++
	}
	return n
}

// identity returns why m does not belong to this group ("" if it does).
func (r *Replica) identity(m *Message) string {
	switch {
	case m.Cluster != r.cfg.Cluster:
		return fmt.Sprintf("cluster %d, ours is %d", m.Cluster, r.cfg.Cluster)
	case m.Epoch != r.cfg.Epoch:
		return fmt.Sprintf("config epoch %d, ours is %d (stale configuration on one side)", m.Epoch, r.cfg.Epoch)
	case m.ConfigHash != r.hash:
		return fmt.Sprintf("member list or lease timing differs (hash %x, ours %x for %s): every member needs the same members, lease, max drift and mark-out",
			m.ConfigHash, r.hash, r.cfg.Identity())
	case !slices.Contains(r.cfg.Members, m.From):
		return fmt.Sprintf("sender %d is not a member of %v", m.From, r.cfg.Members)
	case m.To != r.cfg.Self:
		return fmt.Sprintf("message for replica %d reached replica %d", m.To, r.cfg.Self)
	case m.From == r.cfg.Self:
		return "message from ourselves"
	case !m.Type.Valid():
		return fmt.Sprintf("unknown message type %d", m.Type)
	}
	return ""
}
