//go:build browser

// The browser test loads /limits in a real headless Chromium. It runs with
// `make test-browser` (go test -tags browser); `make test` does not need
// Chromium. A missing Chromium fails the test: it is not skipped.

package limitspage_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromiumPath finds Debian's chromium, or fails with the install hint.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found on PATH: the browser test needs it (apt-get install -y chromium), or set CHROMIUM to its path")
	return ""
}

// rowText returns the text of each cell of the rule's row, keyed by class.
func rowText(ctx context.Context, rule string) (map[string]string, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[map[string]string](`(() => {
		const row = [...document.querySelectorAll("table.rules tr[data-rule]")].find(r => r.dataset.rule === `+jsString(rule)+`);
		if (!row) return null;
		const out = {};
		for (const td of row.querySelectorAll("td")) {
			for (const c of td.classList) out[c] = td.innerText.trim();
		}
		out.rule = row.querySelector(".rule").innerText.trim();
		return out;
	})()`))
}

func jsString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

func TestBrowserShowsLimits(t *testing.T) {
	exe := chromiumPath(t)
	f := newFixture(t)
	f.script(t)
	hs := mount(f.handler) // httptest listens on 127.0.0.1
	defer hs.Close()

	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 1000),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	if err := chromedp.Do(bctx,
		chromedp.Navigate(hs.URL+"/limits"),
		chromedp.WaitVisible(chromedp.CSS("table.rules")),
	); err != nil {
		t.Fatalf("load /limits in chromium: %v", err)
	}
	title, err := chromedp.Run(bctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	heading, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("h1")))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("table.rules tbody tr").length`))
	if err != nil {
		t.Fatal(err)
	}
	if title != "ratelimitd limits" || heading != "ratelimitd limits" || rules != 5 {
		t.Errorf("page title %q, heading %q, %d rule rows; want ratelimitd limits twice and 5 rows", title, heading, rules)
	}

	want := []struct {
		rule                        string
		rate, burst, requests, shed string
	}{
		{"gpt-4o", "600 per minute", "6", "8", "2"},
		{"shadowed", "1 per minute", "1", "3", "0"},
		{"internal", "unlimited", "–", "1", "0"},
	}
	check := func(when string, moved map[string]string) {
		t.Helper()
		for _, w := range want {
			cells, err := rowText(bctx, w.rule)
			if err != nil || cells == nil {
				t.Fatalf("%s: row %s: %v (cells %v)", when, w.rule, err, cells)
			}
			requests, shed := w.requests, w.shed
			if v, ok := moved[w.rule]; ok {
				requests, shed, _ = strings.Cut(v, "/")
			}
			// The shed cell has class "shed", plus "nonzero" when it is.
			if cells["rule"] != w.rule || cells["rate"] != w.rate || cells["burst"] != w.burst ||
				cells["requests"] != requests || cells["shed"] != shed {
				t.Errorf("%s: row %s shows %v; want rate %q, burst %q, requests %q, shed %q",
					when, w.rule, cells, w.rate, w.burst, requests, shed)
			}
		}
	}
	check("first load", nil)
	shedColor, err := chromedp.Run(bctx, chromedp.Evaluate[string](
		`getComputedStyle(document.querySelector('tr[data-rule="gpt-4o"] td.shed')).color`))
	if err != nil {
		t.Fatal(err)
	}
	if shedColor != "rgb(179, 38, 30)" {
		t.Errorf("the shed count of gpt-4o is %s, want it red (rgb(179, 38, 30))", shedColor)
	}

	// More traffic, ten seconds later, then a reload: the counts move.
	f.clock.Advance(10 * time.Second)
	f.call(t, 4, "model", "gpt-4o") // 10 s refilled 100 tokens: all 4 pass
	f.call(t, 2, "model", "shadowed")
	if err := chromedp.Do(bctx,
		chromedp.Reload(),
		chromedp.WaitVisible(chromedp.CSS("table.rules")),
	); err != nil {
		t.Fatalf("reload /limits: %v", err)
	}
	busiest, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("table.busiest")))
	if err != nil {
		t.Fatal(err)
	}
	check("after more traffic", map[string]string{"gpt-4o": "12/2", "shadowed": "5/0"})
	if !strings.Contains(busiest, "model=gpt-4o") || !strings.Contains(busiest, "4 / 6") {
		t.Errorf("busiest buckets read %q, want gpt-4o with 4 / 6 in use", busiest)
	}

	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shot := filepath.Join(t.TempDir(), "limits.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if dir := os.Getenv("LIMITSPAGE_SCREENSHOT_DIR"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, "limits.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
}
