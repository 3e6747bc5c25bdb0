package auto

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestScheduled: a function as written is not scheduled; each schedule
// primitive leaves a sign that Scheduled names, and so does a default
// schedule.
func TestScheduled(t *testing.T) {
	src := fusedDense(4, 32, 16, false)
	for _, tc := range []struct {
		name  string
		apply func(s *schedule.Schedule, b schedule.BlockRV, loops []schedule.LoopRV) error
		want  string // "" when not scheduled
	}{
		{"as written", nil, ""},
		{"parallel", func(s *schedule.Schedule, _ schedule.BlockRV, l []schedule.LoopRV) error { return s.Parallel(l[0]) }, "is parallel"},
		{"unroll", func(s *schedule.Schedule, _ schedule.BlockRV, l []schedule.LoopRV) error { return s.Unroll(l[2]) }, "is unroll"},
		{"annotate", func(s *schedule.Schedule, _ schedule.BlockRV, l []schedule.LoopRV) error {
			return s.Annotate(l[0], "pragma_unroll_explicit", int64(1))
		}, "is annotated"},
		{"split", func(s *schedule.Schedule, _ schedule.BlockRV, l []schedule.LoopRV) error {
			_, err := s.Split(l[1], 4, 8)
			return err
		}, "is bound to"},
		{"reorder", func(s *schedule.Schedule, _ schedule.BlockRV, l []schedule.LoopRV) error {
			return s.Reorder(l[1], l[0])
		}, "reordered"},
		{"cache write", func(s *schedule.Schedule, b schedule.BlockRV, _ []schedule.LoopRV) error {
			_, err := s.CacheWrite(b, 0, "local")
			return err
		}, `in scope "local"`},
		{"decompose reduction", func(s *schedule.Schedule, b schedule.BlockRV, l []schedule.LoopRV) error {
			_, err := s.DecomposeReduction(b, l[2])
			return err
		}, "without its init"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := parseFunc(t, src)
			if tc.apply != nil {
				s, err := schedule.New(f)
				check.NoError(t, err)
				b, err := s.GetBlock("matmul")
				check.NoError(t, err)
				loops, err := s.GetLoops(b)
				check.NoError(t, err)
				check.NoError(t, tc.apply(s, b, loops))
				f = s.Func()
			}
			got, sign := Scheduled(f)
			check.Equal(t, got, tc.want != "", sign)
			check.True(t, strings.Contains(sign, tc.want), sign)
		})
	}

	g, rule, err := FuncRule(parseFunc(t, src), Options{})
	check.NoError(t, err)
	check.Equal(t, rule, RuleMatmul)
	got, sign := Scheduled(g)
	check.True(t, got, "the default schedule's output is scheduled", sign)
}
