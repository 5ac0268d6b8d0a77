/* faultwatch.rules._batchscan: the matcher's per-line reading of rank prefixes in one C pass
 * over a batch (the newline-joined texts, as a str), for Matcher._run_ranks.
 *
 * It does what engine.py's pure-Python reading does with a regex split and a token search
 * (that code stays the authority and the fallback; tests/unit/rules compare the two):
 *  - at each line start, the run of one kind's rank prefixes (CARRIER_KINDS' `run`: up to
 *    8 tokens, the innermost token's rank), for the first kind of `kinds` that starts a line;
 *    also after an RFC 3339 time at the line start (kubectl --timestamps), which the Python
 *    split does not take (its batches go carrier by carrier there);
 *  - past each line's run, every token of the `search` kinds (CARRIER_KINDS' `token`), as
 *    (line index, where the token ends in the line, is it a `[word3]:` token), for Python to
 *    read with the full prefix grammar.
 * Only ASCII is ever matched (the Python patterns are compiled with re.ASCII); a str of any
 * width is read in place, offsets are in characters, as Python's.
 *
 * Kinds (CARRIER_KINDS' order): 0 `[word3]:`, 1 `[Rank 3] `, 2 `[1,3]<stdout>:`, 3 ` 3: `.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_RUN 8 /* normalise.MAX_STACK: tokens in one line's run at most */

typedef struct {
    int kind;
    const void *data;
    Py_ssize_t len;
} Text;

static inline Py_UCS4 at(const Text *t, Py_ssize_t i) {
    return PyUnicode_READ(t->kind, t->data, i);
}

static inline int is_digit(Py_UCS4 c) { return c >= '0' && c <= '9'; }
static inline int is_word(Py_UCS4 c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

/* Digits from i, at least lo and at most hi of them, none after: their end, or -1; their
 * value in *val when val is given. */
static Py_ssize_t digits(const Text *t, Py_ssize_t i, Py_ssize_t end, int lo, int hi,
                         long *val) {
    Py_ssize_t j = i;
    long v = 0;
    while (j < end && is_digit(at(t, j))) {
        if (j - i >= hi)
            return -1; /* more than hi: what follows is a digit, not what the pattern wants */
        v = v * 10 + (long)(at(t, j) - '0');
        j++;
    }
    if (j - i < lo)
        return -1;
    if (val)
        *val = v;
    return j;
}

static int lit(const Text *t, Py_ssize_t i, Py_ssize_t end, const char *s) {
    for (; *s; s++, i++)
        if (i >= end || at(t, i) != (Py_UCS4)(unsigned char)*s)
            return 0;
    return 1;
}

/* One token of `kind` at i: its end, or -1; its rank in *rank. `run`: the run's form (an
 * optional space after `]:` / `>:` is part of it). */
static Py_ssize_t token(const Text *t, int kind, Py_ssize_t i, Py_ssize_t end, long *rank,
                        int run) {
    Py_ssize_t j;
    switch (kind) {
    case 0: /* \[[A-Za-z_]{1,32}\d{1,7}\]: */
        if (i >= end || at(t, i) != '[')
            return -1;
        j = i + 1;
        while (j < end && is_word(at(t, j)))
            j++;
        if (j - (i + 1) < 1 || j - (i + 1) > 32)
            return -1;
        j = digits(t, j, end, 1, 7, rank);
        if (j < 0 || !lit(t, j, end, "]:"))
            return -1;
        j += 2;
        if (run && j < end && at(t, j) == ' ')
            j++;
        return j;
    case 1: /* \[Rank \d{1,7}\] */
        if (!lit(t, i, end, "[Rank "))
            return -1;
        j = digits(t, i + 6, end, 1, 7, rank);
        if (j < 0 || !lit(t, j, end, "] "))
            return -1;
        return j + 2;
    case 2: /* \[\d{1,6},\d{1,7}\]<(?:stdout|stderr)>: */
        if (i >= end || at(t, i) != '[')
            return -1;
        j = digits(t, i + 1, end, 1, 6, NULL);
        if (j < 0 || !lit(t, j, end, ","))
            return -1;
        j = digits(t, j + 1, end, 1, 7, rank);
        if (j < 0 || !(lit(t, j, end, "]<stdout>:") || lit(t, j, end, "]<stderr>:")))
            return -1;
        j += 10;
        if (run && j < end && at(t, j) == ' ')
            j++;
        return j;
    case 3:
        if (run) { /*  {0,6}(\d{1,6}): */
            j = i;
            while (j < end && at(t, j) == ' ')
                j++;
            if (j - i > 6)
                return -1;
            j = digits(t, j, end, 1, 6, rank);
        } else { /* \d: (the token search's form) */
            j = (i < end && is_digit(at(t, i))) ? i + 1 : -1;
        }
        if (j < 0 || !lit(t, j, end, ": "))
            return -1;
        return j + 2;
    }
    return -1;
}

/* An RFC 3339 time and its space at i (normalise.PREFIX_KINDS' `rfc3339`: kubectl logs
 * --timestamps, docker logs -t): its end, or i when there is none.
 * \d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?:? */
static Py_ssize_t time_at(const Text *t, Py_ssize_t i, Py_ssize_t end) {
    static const char form[] = "dddd-dd-ddTdd:dd:dd";
    Py_ssize_t j = i;
    for (const char *f = form; *f; f++, j++) {
        if (j >= end)
            return i;
        Py_UCS4 c = at(t, j);
        if (*f == 'd' ? !is_digit(c) : *f == 'T' ? (c != 'T' && c != ' ') : c != (Py_UCS4)*f)
            return i;
    }
    if (j < end && (at(t, j) == '.' || at(t, j) == ',')) {
        j = digits(t, j + 1, end, 1, 9, NULL);
        if (j < 0)
            return i;
    }
    if (j < end && at(t, j) == 'Z') {
        j++;
    } else if (j < end && (at(t, j) == '+' || at(t, j) == '-')) {
        Py_ssize_t z = j + 1;
        if (z + 1 < end && is_digit(at(t, z)) && is_digit(at(t, z + 1))) {
            z += 2;
            if (z < end && at(t, z) == ':')
                z++;
            if (z + 1 < end && is_digit(at(t, z)) && is_digit(at(t, z + 1)))
                j = z + 2;
        }
        if (j < end && (at(t, j) == '+' || at(t, j) == '-'))
            return i; /* a zone that is no zone: `:? ` cannot follow */
    }
    if (j < end && at(t, j) == ':')
        j++;
    return (j < end && at(t, j) == ' ') ? j + 1 : i;
}

/* The end of the run of `kind` tokens at a line start i (up to MAX_RUN), after an RFC 3339
 * time if the line starts with one, or -1 when none; the innermost token's rank in *rank. */
static Py_ssize_t run_at(const Text *t, int kind, Py_ssize_t i, Py_ssize_t end, long *rank) {
    Py_ssize_t j = time_at(t, i, end);
    int k;
    for (k = 0; k < MAX_RUN; k++) {
        long r;
        Py_ssize_t e = token(t, kind, j, end, &r, 1);
        if (e < 0)
            break;
        *rank = r;
        j = e;
    }
    return k ? j : -1;
}

static Py_ssize_t line_end(const Text *t, Py_ssize_t i) {
    if (t->kind == PyUnicode_1BYTE_KIND) {
        const char *p = memchr((const char *)t->data + i, '\n', (size_t)(t->len - i));
        return p ? p - (const char *)t->data : t->len;
    }
    while (i < t->len && at(t, i) != '\n')
        i++;
    return i;
}

static PyObject *run_ranks(PyObject *self, PyObject *args) {
    PyObject *joined, *kinds, *dflt;
    int search;
    if (!PyArg_ParseTuple(args, "UO!iO", &joined, &PyTuple_Type, &kinds, &search, &dflt))
        return NULL;
    Text t = {PyUnicode_KIND(joined), PyUnicode_DATA(joined), PyUnicode_GET_LENGTH(joined)};
    /* the first kind (in `kinds` order) whose run starts some line */
    int kind = -1;
    Py_ssize_t nk = PyTuple_GET_SIZE(kinds);
    for (Py_ssize_t q = 0; q < nk && kind < 0; q++) {
        long kd = PyLong_AsLong(PyTuple_GET_ITEM(kinds, q));
        if (kd < 0 || kd > 3) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "run_ranks: a kind is 0..3");
            return NULL;
        }
        for (Py_ssize_t i = 0; i <= t.len;) {
            Py_ssize_t e = line_end(&t, i);
            long r;
            if (run_at(&t, (int)kd, i, e, &r) >= 0) {
                kind = (int)kd;
                break;
            }
            i = e + 1;
        }
    }
    if (kind < 0)
        Py_RETURN_NONE;
    int one_byte = t.kind == PyUnicode_1BYTE_KIND;
    int srun = (search & 8) != 0;
    PyObject *ranks = PyList_New(0), *found = PyList_New(0);
    if (!ranks || !found)
        goto fail;
    Py_ssize_t line = 0;
    for (Py_ssize_t i = 0; i <= t.len; line++) {
        Py_ssize_t e = line_end(&t, i);
        long r = 0;
        Py_ssize_t j = run_at(&t, kind, i, e, &r);
        PyObject *rk;
        if (j >= 0) {
            rk = PyLong_FromLong(r);
            if (!rk)
                goto fail;
        } else {
            j = i;
            rk = Py_NewRef(dflt);
        }
        int bad = PyList_Append(ranks, rk);
        Py_DECREF(rk);
        if (bad)
            goto fail;
        /* tokens of the search kinds past the run (they hold no newline, and none starts
         * inside another: every start of one is reported). Every token but an srun label
         * starts with `[`; an srun label `\d: ` is found from its `:`. */
        while (j < e) {
            Py_ssize_t c = j; /* the next `[` (or `:` when labels are searched) */
            if (one_byte && !srun) {
                const char *p = memchr((const char *)t.data + j, '[', (size_t)(e - j));
                c = p ? p - (const char *)t.data : e;
            } else if (one_byte) {
                const unsigned char *d = (const unsigned char *)t.data;
                while (c < e && d[c] != '[' && d[c] != ':')
                    c++;
            } else {
                while (c < e && at(&t, c) != '[' && !(srun && at(&t, c) == ':'))
                    c++;
            }
            if (c >= e)
                break;
            Py_ssize_t a = c, b = -1;
            int kd = 3;
            if (at(&t, c) == ':') {
                a = c - 1; /* the label's digit */
                if (a >= j)
                    b = token(&t, 3, a, e, NULL, 0);
            } else {
                for (kd = 0; kd < 3; kd++)
                    if ((search & (1 << kd)) && (b = token(&t, kd, a, e, NULL, 0)) >= 0)
                        break;
            }
            if (b < 0) {
                j = c + 1;
                continue;
            }
            PyObject *hit = Py_BuildValue("(nnO)", line, b - i, kd == 0 ? Py_True : Py_False);
            if (!hit)
                goto fail;
            bad = PyList_Append(found, hit);
            Py_DECREF(hit);
            if (bad)
                goto fail;
            j = b;
        }
        i = e + 1;
    }
    return Py_BuildValue("(NN)", ranks, found);
fail:
    Py_XDECREF(ranks);
    Py_XDECREF(found);
    return NULL;
}

static PyMethodDef methods[] = {
    {"run_ranks", run_ranks, METH_VARARGS,
     "run_ranks(joined, kinds, search, default) -> (ranks, found) | None\n\n"
     "Each line's rank from the run of one kind's rank prefixes at its start (the first of\n"
     "`kinds` that starts a line; `default` for lines without), and (line, token end in the\n"
     "line, is a [word3]: token) for each token of the `search` kinds (bit k: kind k) past\n"
     "the runs. None when no kind starts a line."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_batchscan",
                                    "The matcher's rank-prefix reading in C (engine.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__batchscan(void) { return PyModule_Create(&module); }
