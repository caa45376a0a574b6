package reconcile

import (
	"encoding/csv"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"time"
)

// jsonReport is a Report as WriteJSON prints it.
type jsonReport struct {
	Processor  string         `json:"processor"`
	Since      time.Time      `json:"since"`
	Until      time.Time      `json:"until"`
	Settle     string         `json:"settle"`
	FinishedAt time.Time      `json:"finished_at"`
	Counts     map[Result]int `json:"counts"`
	Mismatches int            `json:"mismatches"`
	References []jsonLine     `json:"references"`
}

type jsonLine struct {
	Reference string             `json:"reference"`
	Result    Result             `json:"result"`
	Detail    string             `json:"detail,omitempty"`
	Ours      *jsonOperation     `json:"ours"`
	Processor []processorPayment `json:"processor"`
}

type jsonOperation struct {
	State          string    `json:"state"`
	Status         string    `json:"status"`
	Amount         int64     `json:"amount"`
	AmountCaptured int64     `json:"amount_captured"`
	AmountRefunded int64     `json:"amount_refunded"`
	Currency       string    `json:"currency"`
	CreatedAt      time.Time `json:"created_at"`
}

type processorPayment struct {
	PSPReference   string    `json:"psp_reference"`
	Status         string    `json:"status"`
	Amount         int64     `json:"amount"`
	Currency       string    `json:"currency"`
	ApprovedAmount int64     `json:"approved_amount"`
	CapturedAmount int64     `json:"captured_amount"`
	RefundedAmount int64     `json:"refunded_amount"`
	Created        time.Time `json:"created"`
}

// WriteJSON writes r as one JSON document: the run, its counts, and a
// line per reference with both sides.
func WriteJSON(w io.Writer, r Report) error {
	out := jsonReport{Processor: r.Processor, Since: r.Since.UTC(), Until: r.Until.UTC(), Settle: r.Settle.String(),
		FinishedAt: r.FinishedAt.UTC(), Counts: r.Counts, Mismatches: r.Mismatches(), References: []jsonLine{}}
	for _, l := range r.Lines {
		jl := jsonLine{Reference: l.Reference, Result: l.Result, Detail: l.Detail, Processor: []processorPayment{}}
		if o := l.Ours; o != nil {
			jl.Ours = &jsonOperation{State: o.State, Status: string(o.Status), Amount: o.Amount, AmountCaptured: o.AmountCaptured,
				AmountRefunded: o.AmountRefunded, Currency: o.Currency, CreatedAt: o.CreatedAt.UTC()}
		}
		for _, p := range l.Payments {
			jl.Processor = append(jl.Processor, processorPayment{PSPReference: p.PSPReference, Status: p.Status, Amount: p.Amount,
				Currency: p.Currency, ApprovedAmount: p.ApprovedAmount, CapturedAmount: p.CapturedAmount,
				RefundedAmount: p.RefundedAmount, Created: p.Created.UTC()})
		}
		out.References = append(out.References, jl)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// CSVHeader is the first row WriteCSV writes.
var CSVHeader = []string{"reference", "result", "detail", "our_status", "our_amount", "our_captured", "our_refunded", "currency",
	"processor_status", "processor_approved", "processor_captured", "processor_refunded", "psp_references"}

// WriteCSV writes r as CSV (RFC 4180): CSVHeader, then a row per
// reference; the processor's columns sum its payments under the reference
// and list their statuses and psp references, separated by spaces. Our
// columns are empty when we have no operation.
func WriteCSV(w io.Writer, r Report) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	for _, l := range r.Lines {
		row := []string{l.Reference, string(l.Result), l.Detail, "", "", "", "", currency(l)}
		if o := l.Ours; o != nil {
			row[3], row[4], row[5], row[6] = string(o.Status), itoa(o.Amount), itoa(o.AmountCaptured), itoa(o.AmountRefunded)
		}
		var statuses, psps []string
		var approved, captured, refunded int64
		for _, p := range l.Payments {
			statuses, psps = append(statuses, p.Status), append(psps, p.PSPReference)
			approved, captured, refunded = approved+p.ApprovedAmount, captured+p.CapturedAmount, refunded+p.RefundedAmount
		}
		row = append(row, strings.Join(statuses, " "), itoa(approved), itoa(captured), itoa(refunded), strings.Join(psps, " "))
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func currency(l Line) string {
	if l.Ours != nil {
		return l.Ours.Currency
	}
	for _, p := range l.Payments {
		return p.Currency
	}
	return ""
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
