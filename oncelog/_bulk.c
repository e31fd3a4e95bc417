/* oncelog._bulk: bulk stamping and framing for Publisher.publish_many (optional C path).
 *
 * frame_json() turns a list of JSON documents into JSON-lines frames, each stamped with a
 * message UUID of one producer, one flags value and consecutive clocks: the documents are
 * encoded by one call of the given `dumps` (orjson.dumps) on the whole list, the list's
 * encoding is cut into its top-level objects, and each object gets `,"<key>":"<uuid>"` before
 * its closing brace, the UUID text formatted straight into the output. Documents that
 * already hold the key are stamped on a copy instead (the key keeps its position), exactly
 * as `JSONMessage.set_uuid` + `JSONFraming.marshal` would. The output is byte-identical to
 * oncelog._bulkframing.frame_json_pure (the tests compare them on the same inputs); when the
 * encoding is not what the cutter expects (say an orjson.Fragment with a raw newline), it
 * returns None and the caller takes the pure path, which reports the error.
 *
 * format_uuid() is the same UUID text for one message (the per-message publishing path).
 *
 * ClockCore is the state of oncelog.identity.Clock (its base class when this is built): a
 * 64-bit clock whose operations are each one C call. Under the GIL a C call that neither
 * calls back into Python nor releases the GIL runs whole before any other thread runs
 * Python code, so every operation is atomic without a lock: no tick is lost, no value is
 * issued twice, `raise_to` never lowers it. (Free-threaded builds take a per-object
 * critical section instead.) stamp_json() is publish_uncommitted/publish_committed's
 * per-message path for a JSONMessage: advance such a clock, format the UUID, set it in the
 * document and encode the line, in one call, with exactly the bytes and errors of
 * `JSONMessage.set_uuid`-style stamping + `JSONFraming.marshal`.
 *
 * The UUID layout is oncelog.message's (Gazette's): time_low-time_mid-time_hi(version 1)-
 * clock sequence (variant, 4-bit sequence counter, 10 flag bits)-node (the producer). The
 * module's state (multi-phase initialisation, no globals) is the ClockCore type and what
 * stamp_json calls: orjson.dumps, its OPT_APPEND_NEWLINE and JSONEncodeError.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define UUID_TEXT 36
#define PRODUCER_LEN 6
#define FLAGS_MASK 0x3FF
/* 100 ns intervals between the RFC 4122 epoch and the Unix epoch (oncelog.identity). */
#define UNIX_EPOCH_OFFSET 122192928000000000LL
#define MASK60 ((UINT64_C(1) << 60) - 1)

#ifdef Py_GIL_DISABLED
#define CLOCK_LOCK(c) Py_BEGIN_CRITICAL_SECTION(c)
#define CLOCK_UNLOCK(c) Py_END_CRITICAL_SECTION()
#else
/* The GIL makes each operation below atomic (see the module comment). */
#define CLOCK_LOCK(c) {
#define CLOCK_UNLOCK(c) }
#endif

static struct PyModuleDef bulk_module;

typedef struct {
    PyTypeObject *clock_type;
    PyObject *dumps;         /* orjson.dumps */
    PyObject *option;        /* orjson.OPT_APPEND_NEWLINE */
    PyObject *option_names;  /* ("option",) */
    PyObject *encode_error;  /* orjson.JSONEncodeError */
    PyObject *time_ns;       /* time.time_ns (where clock_gettime is not available) */
} bulk_state;

static inline bulk_state *
get_state(PyObject *module)
{
    return (bulk_state *)PyModule_GetState(module);
}

static const char HEX[] = "0123456789abcdef";

static inline void
put_hex(char *out, uint64_t value, int digits)
{
    for (int i = digits - 1; i >= 0; i--) {
        out[i] = HEX[value & 0xF];
        value >>= 4;
    }
}

/* The 12 hex digits of a producer ID. */
static void
node_hex(char *out, const unsigned char *producer)
{
    for (int i = 0; i < PRODUCER_LEN; i++) {
        out[2 * i] = HEX[producer[i] >> 4];
        out[2 * i + 1] = HEX[producer[i] & 0xF];
    }
}

/* The canonical 36-character text of the UUID of (producer, clock, flags). */
static inline void
format_text(char *out, const char *node, uint64_t clock, unsigned flags)
{
    uint64_t ts = clock >> 4;
    put_hex(out, ts & 0xFFFFFFFFu, 8);
    out[8] = '-';
    put_hex(out + 9, (ts >> 32) & 0xFFFF, 4);
    out[13] = '-';
    put_hex(out + 14, ((ts >> 48) & 0x0FFF) | 0x1000, 4);
    out[18] = '-';
    put_hex(out + 19, ((clock & 0xF) << 10) | flags | 0x8000, 4);
    out[23] = '-';
    memcpy(out + 24, node, 12);
}

/* Parse (producer, clock, flags); 0 on success, -1 with an exception set. */
static int
parse_ids(PyObject *producer, PyObject *clock, PyObject *flags,
          char *node, uint64_t *clock_out, unsigned *flags_out)
{
    if (!PyBytes_Check(producer) || PyBytes_GET_SIZE(producer) != PRODUCER_LEN) {
        PyErr_SetString(PyExc_ValueError, "producer ID must be 6 bytes");
        return -1;
    }
    node_hex(node, (const unsigned char *)PyBytes_AS_STRING(producer));
    unsigned long long c = PyLong_AsUnsignedLongLong(clock);
    if (c == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "clock is outside the unsigned 64-bit range");
        return -1;
    }
    long f = PyLong_AsLong(flags);
    if (f == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (f < 0 || f > FLAGS_MASK) {
        PyErr_Format(PyExc_ValueError, "flags %ld do not fit in 10 bits", f);
        return -1;
    }
    *clock_out = (uint64_t)c;
    *flags_out = (unsigned)f;
    return 0;
}

static PyObject *
bulk_format_uuid(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "format_uuid(producer, clock, flags)");
        return NULL;
    }
    char node[12], text[UUID_TEXT];
    uint64_t clock;
    unsigned flags;
    if (parse_ids(args[0], args[1], args[2], node, &clock, &flags) < 0) {
        return NULL;
    }
    format_text(text, node, clock, flags);
    return PyUnicode_FromStringAndSize(text, UUID_TEXT);
}

/* The end (one past the closing brace) of the JSON object starting at data[pos], or -1 if
 * the encoding is not a balanced object there (or holds a raw newline). */
static Py_ssize_t
object_end(const char *data, Py_ssize_t pos, Py_ssize_t len)
{
    Py_ssize_t depth = 0;
    while (pos < len) {
        char c = data[pos];
        if (c == '"') {
            pos++;
            for (;;) {
                if (pos >= len) {
                    return -1;
                }
                c = data[pos];
                if (c == '\\') {
                    pos += 2;
                }
                else if (c == '"') {
                    pos++;
                    break;
                }
                else if (c == '\n') {
                    return -1;
                }
                else {
                    pos++;
                }
            }
            continue;
        }
        if (c == '{' || c == '[') {
            depth++;
        }
        else if (c == '}' || c == ']') {
            if (--depth == 0) {
                return pos + 1;
            }
            if (depth < 0) {
                return -1;
            }
        }
        else if (c == '\n') {
            return -1;
        }
        pos++;
    }
    return -1;
}

static PyObject *
bulk_frame_json(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "frame_json(docs, key, key_json, producer, first_clock, flags, dumps)");
        return NULL;
    }
    PyObject *docs = args[0], *key = args[1], *key_json = args[2], *dumps = args[6];
    if (!PyList_Check(docs) || !PyUnicode_Check(key) || !PyBytes_Check(key_json)) {
        PyErr_SetString(PyExc_TypeError, "frame_json: docs must be a list, key a str, "
                                         "key_json bytes");
        return NULL;
    }
    char node[12], text[UUID_TEXT];
    uint64_t first;
    unsigned flags;
    if (parse_ids(args[3], args[4], args[5], node, &first, &flags) < 0) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(docs);
    if (n == 0) {
        return PyBytes_FromStringAndSize(NULL, 0);
    }

    /* Documents holding the key already: stamp a copy (the key keeps its place). */
    PyObject *todump = docs;
    unsigned char *stamped = NULL;
    PyObject *dumped = NULL, *out = NULL;
    Py_INCREF(todump);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *doc = PyList_GET_ITEM(docs, i);
        if (!PyDict_Check(doc)) {
            PyErr_Format(PyExc_TypeError,
                         "document %zd of the batch is a %.100s, not a dict: a JSON frame "
                         "must be an object", i, Py_TYPE(doc)->tp_name);
            goto error;
        }
        int has = PyDict_Contains(doc, key);
        if (has < 0) {
            goto error;
        }
        if (!has) {
            continue;
        }
        if (stamped == NULL) {
            stamped = PyMem_Calloc((size_t)n, 1);
            if (stamped == NULL) {
                PyErr_NoMemory();
                goto error;
            }
            Py_DECREF(todump);
            todump = PyList_GetSlice(docs, 0, n);
            if (todump == NULL) {
                goto error;
            }
        }
        PyObject *copy = PyDict_Copy(doc);
        if (copy == NULL) {
            goto error;
        }
        format_text(text, node, first + (uint64_t)i, flags);
        PyObject *value = PyUnicode_FromStringAndSize(text, UUID_TEXT);
        if (value == NULL || PyDict_SetItem(copy, key, value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(copy);
            goto error;
        }
        Py_DECREF(value);
        PyList_SET_ITEM(todump, i, copy);  /* steals copy, drops our slice's reference */
        Py_DECREF(doc);
        stamped[i] = 1;
    }

    dumped = PyObject_CallOneArg(dumps, todump);
    if (dumped == NULL) {
        goto error;
    }
    if (!PyBytes_Check(dumped)) {
        PyErr_SetString(PyExc_TypeError, "frame_json: dumps must return bytes");
        goto error;
    }
    const char *data = PyBytes_AS_STRING(dumped);
    Py_ssize_t len = PyBytes_GET_SIZE(dumped);
    const char *kj = PyBytes_AS_STRING(key_json);
    Py_ssize_t kjlen = PyBytes_GET_SIZE(key_json);
    /* Each frame grows by at most `,<key>:"<uuid>"` and a newline. */
    Py_ssize_t extra = kjlen + UUID_TEXT + 5;
    if (n > (PY_SSIZE_T_MAX - len) / extra) {
        PyErr_NoMemory();
        goto error;
    }
    out = PyBytes_FromStringAndSize(NULL, len + n * extra);
    if (out == NULL) {
        goto error;
    }
    char *w = PyBytes_AS_STRING(out);
    Py_ssize_t pos = 1;
    if (len < 2 || data[0] != '[') {
        goto fallback;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0) {
            if (data[pos] != ',') {
                goto fallback;
            }
            pos++;
        }
        if (pos >= len || data[pos] != '{') {
            goto fallback;
        }
        Py_ssize_t end = object_end(data, pos, len);
        if (end < 0) {
            goto fallback;
        }
        if (stamped != NULL && stamped[i]) {
            memcpy(w, data + pos, (size_t)(end - pos));
            w += end - pos;
        }
        else {
            if (end - pos == 2) {  /* {} */
                *w++ = '{';
            }
            else {
                memcpy(w, data + pos, (size_t)(end - pos - 1));
                w += end - pos - 1;
                *w++ = ',';
            }
            memcpy(w, kj, (size_t)kjlen);
            w += kjlen;
            *w++ = ':';
            *w++ = '"';
            format_text(w, node, first + (uint64_t)i, flags);
            w += UUID_TEXT;
            *w++ = '"';
            *w++ = '}';
        }
        *w++ = '\n';
        pos = end;
        if (pos >= len) {
            goto fallback;
        }
    }
    if (data[pos] != ']' || pos + 1 != len) {
        goto fallback;
    }
    if (_PyBytes_Resize(&out, w - PyBytes_AS_STRING(out)) < 0) {
        goto error;  /* out was freed and set to NULL */
    }
    Py_DECREF(dumped);
    Py_DECREF(todump);
    PyMem_Free(stamped);
    return out;

fallback:
    Py_XDECREF(out);
    Py_XDECREF(dumped);
    Py_DECREF(todump);
    PyMem_Free(stamped);
    Py_RETURN_NONE;

error:
    Py_XDECREF(out);
    Py_XDECREF(dumped);
    Py_XDECREF(todump);
    PyMem_Free(stamped);
    return NULL;
}

/* -- ClockCore: the lock-free state of oncelog.identity.Clock ------------------------------ */

typedef struct {
    PyObject_HEAD
    uint64_t value;
} ClockCore;

/* The clock of now, without its sequence counter: (unix_ns // 100 + offset) << 4. */
static int
now_clock(PyObject *module, uint64_t *out)
{
#if defined(CLOCK_REALTIME) && !defined(_WIN32)
    (void)module;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    /* tv_nsec is in [0, 1e9): this is the floor division of the nanoseconds by 100. */
    int64_t ticks = (int64_t)ts.tv_sec * 10000000 + ts.tv_nsec / 100;
    *out = (uint64_t)(ticks + UNIX_EPOCH_OFFSET) << 4;
    return 0;
#else
    PyObject *ns = PyObject_CallNoArgs(get_state(module)->time_ns);
    if (ns == NULL) {
        return -1;
    }
    long long v = PyLong_AsLongLong(ns);
    Py_DECREF(ns);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    long long ticks = v / 100 - (v % 100 < 0);
    *out = (uint64_t)(ticks + UNIX_EPOCH_OFFSET) << 4;
    return 0;
#endif
}

/* One past the larger of the clock and `target` (wrapping at 2**64, as the Python clock). */
static inline uint64_t
clock_advance(ClockCore *self, uint64_t target)
{
    uint64_t value;
    CLOCK_LOCK(self);
    value = (self->value > target ? self->value : target) + 1;
    self->value = value;
    CLOCK_UNLOCK(self);
    return value;
}

static int
clock_init(ClockCore *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"value", NULL};
    PyObject *value = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:ClockCore", names, &value)) {
        return -1;
    }
    unsigned long long v = 0;
    if (value != NULL) {
        if (!PyLong_Check(value)) {
            PyErr_Format(PyExc_TypeError, "clock value must be an int, not %.100s",
                         Py_TYPE(value)->tp_name);
            return -1;
        }
        v = PyLong_AsUnsignedLongLong(value);
        if (v == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "clock value %R is outside the unsigned 64-bit range", value);
            return -1;
        }
    }
    CLOCK_LOCK(self);
    self->value = (uint64_t)v;
    CLOCK_UNLOCK(self);
    return 0;
}

static PyObject *
clock_get_value(ClockCore *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(self->value);
}

static PyObject *
clock_tick(ClockCore *self, PyObject *unused)
{
    uint64_t value;
    CLOCK_LOCK(self);
    value = ++self->value;
    CLOCK_UNLOCK(self);
    return PyLong_FromUnsignedLongLong(value);
}

static PyObject *
clock_reserve(ClockCore *self, PyObject *n)
{
    if (!PyLong_Check(n)) {
        PyErr_Format(PyExc_TypeError, "reserve takes an int, not %.100s", Py_TYPE(n)->tp_name);
        return NULL;
    }
    int overflow;
    long long small = PyLong_AsLongLongAndOverflow(n, &overflow);
    if (small == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow < 0 || (overflow == 0 && small < 1)) {
        PyErr_Format(PyExc_ValueError, "reserve at least one clock, not %R", n);
        return NULL;
    }
    uint64_t add = (uint64_t)PyLong_AsUnsignedLongLongMask(n);  /* n mod 2**64 */
    if (add == (uint64_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    uint64_t first;
    CLOCK_LOCK(self);
    first = self->value + 1;
    self->value += add;
    CLOCK_UNLOCK(self);
    return PyLong_FromUnsignedLongLong(first);
}

static PyObject *
clock_advance_method(ClockCore *self, PyObject *unused)
{
    uint64_t target;
#if defined(CLOCK_REALTIME) && !defined(_WIN32)
    PyObject *module = NULL;  /* not needed: the time comes from clock_gettime */
#else
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(self), &bulk_module);
    if (module == NULL) {
        return NULL;
    }
#endif
    if (now_clock(module, &target) < 0) {
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(clock_advance(self, target));
}

static PyObject *
clock_raise_to(ClockCore *self, PyObject *target)
{
    unsigned long long t = PyLong_AsUnsignedLongLong(target);
    if (t == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    uint64_t value;
    CLOCK_LOCK(self);
    if ((uint64_t)t > self->value) {
        self->value = (uint64_t)t;
    }
    value = self->value;
    CLOCK_UNLOCK(self);
    return PyLong_FromUnsignedLongLong(value);
}

static PyMethodDef clock_methods[] = {
    {"tick", (PyCFunction)clock_tick, METH_NOARGS,
     "tick()\n--\n\nAdd one and return the new value."},
    {"reserve", (PyCFunction)clock_reserve, METH_O,
     "reserve(n, /)\n--\n\nAdd `n` (>= 1) and return the first of the `n` values passed."},
    {"advance", (PyCFunction)clock_advance_method, METH_NOARGS,
     "advance()\n--\n\nOne past the larger of the clock and the clock of now."},
    {"_raise_to", (PyCFunction)clock_raise_to, METH_O,
     "_raise_to(target, /)\n--\n\nMove to `target` if that is larger; return the value."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef clock_getset[] = {
    {"value", (getter)clock_get_value, NULL, "The current value.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int
clock_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static void
clock_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyType_Slot clock_slots[] = {
    {Py_tp_doc, "The lock-free state of oncelog.identity.Clock (each operation is atomic)."},
    {Py_tp_init, clock_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_methods, clock_methods},
    {Py_tp_getset, clock_getset},
    {Py_tp_traverse, clock_traverse},
    {Py_tp_dealloc, clock_dealloc},
    {0, NULL},
};

static PyType_Spec clock_spec = {
    .name = "oncelog._bulk.ClockCore",
    .basicsize = sizeof(ClockCore),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = clock_slots,
};

/* -- stamp_json: one JSONMessage stamped and framed ---------------------------------------- */

/* Call fail(what), which must raise; returns NULL with its exception set. */
static PyObject *
call_fail(PyObject *fail, PyObject *what)
{
    PyObject *r = PyObject_CallOneArg(fail, what);
    if (r != NULL) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_SystemError, "stamp_json: fail() returned instead of raising");
    }
    return NULL;
}

static PyObject *
bulk_stamp_json(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "stamp_json(doc, key, producer, clock, flags, fail)");
        return NULL;
    }
    bulk_state *st = get_state(module);
    PyObject *doc = args[0], *key = args[1], *producer = args[2], *clock = args[3];
    PyObject *fail = args[5];
    if (!PyDict_CheckExact(doc)) {
        PyErr_Format(PyExc_TypeError, "stamp_json: the document is a %.100s, not a dict",
                     Py_TYPE(doc)->tp_name);
        return NULL;
    }
    if (!PyObject_TypeCheck(clock, st->clock_type)) {
        PyErr_Format(PyExc_TypeError, "stamp_json: the clock is a %.100s, not a ClockCore",
                     Py_TYPE(clock)->tp_name);
        return NULL;
    }
    if (!PyBytes_Check(producer) || PyBytes_GET_SIZE(producer) != PRODUCER_LEN) {
        PyErr_SetString(PyExc_ValueError, "producer ID must be 6 bytes");
        return NULL;
    }
    long f = PyLong_AsLong(args[4]);
    if (f == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (f < 0 || f > FLAGS_MASK) {
        PyErr_Format(PyExc_ValueError, "flags %ld do not fit in 10 bits", f);
        return NULL;
    }
    uint64_t target;
    if (now_clock(module, &target) < 0) {
        return NULL;
    }
    /* From here on, as the slow path: the clock moves, the document gets its UUID, and
     * then it is encoded (an encoding error leaves both done). */
    uint64_t value = clock_advance((ClockCore *)clock, target);
    char node[12];
    node_hex(node, (const unsigned char *)PyBytes_AS_STRING(producer));
    PyObject *text = PyUnicode_New(UUID_TEXT, 127);
    if (text == NULL) {
        return NULL;
    }
    format_text((char *)PyUnicode_1BYTE_DATA(text), node, value, (unsigned)f);
    int set = PyDict_SetItem(doc, key, text);
    Py_DECREF(text);
    if (set < 0) {
        return NULL;
    }
    PyObject *call[2] = {doc, st->option};
    PyObject *line = PyObject_Vectorcall(st->dumps, call, 1, st->option_names);
    if (line == NULL) {
        if (!PyErr_ExceptionMatches(st->encode_error)) {
            return NULL;
        }
#if PY_VERSION_HEX >= 0x030C0000
        PyObject *exc = PyErr_GetRaisedException();
#else
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL) {
            PyException_SetTraceback(exc, tb);
        }
        Py_XDECREF(type);
        Py_XDECREF(tb);
#endif
        call_fail(fail, exc);
        Py_DECREF(exc);
        return NULL;
    }
    if (!PyBytes_Check(line)) {
        Py_DECREF(line);
        PyErr_SetString(PyExc_TypeError, "stamp_json: dumps must return bytes");
        return NULL;
    }
    const char *data = PyBytes_AS_STRING(line);
    Py_ssize_t len = PyBytes_GET_SIZE(line);
    if (len == 0 || memchr(data, '\n', (size_t)len) != data + len - 1) {
        /* Only an orjson.Fragment can smuggle a raw newline in. */
        call_fail(fail, line);
        Py_DECREF(line);
        return NULL;
    }
    PyObject *number = PyLong_FromUnsignedLongLong(value);
    if (number == NULL) {
        Py_DECREF(line);
        return NULL;
    }
    PyObject *out = PyTuple_New(2);
    if (out == NULL) {
        Py_DECREF(line);
        Py_DECREF(number);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, line);
    PyTuple_SET_ITEM(out, 1, number);
    return out;
}

static PyMethodDef bulk_methods[] = {
    {"frame_json", (PyCFunction)(void (*)(void))bulk_frame_json, METH_FASTCALL,
     "frame_json(docs, key, key_json, producer, first_clock, flags, dumps, /)\n--\n\n"
     "JSON-lines frames of `docs`, stamped with consecutive clocks from `first_clock`; "
     "None if the encoding cannot be cut (take the pure path)."},
    {"format_uuid", (PyCFunction)(void (*)(void))bulk_format_uuid, METH_FASTCALL,
     "format_uuid(producer, clock, flags, /)\n--\n\n"
     "The canonical text of the message UUID of (producer, clock, flags)."},
    {"stamp_json", (PyCFunction)(void (*)(void))bulk_stamp_json, METH_FASTCALL,
     "stamp_json(doc, key, producer, clock, flags, fail, /)\n--\n\n"
     "Advance `clock` (a ClockCore), set doc[key] to the UUID text and return "
     "(orjson.dumps(doc, option=OPT_APPEND_NEWLINE), clock value); encoding errors "
     "call fail(exception or line), which raises."},
    {NULL, NULL, 0, NULL},
};

static int
bulk_exec(PyObject *module)
{
    bulk_state *st = get_state(module);
    if (PyModule_AddIntConstant(module, "UUID_TEXT_LEN", UUID_TEXT) < 0) {
        return -1;
    }
    st->clock_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &clock_spec, NULL);
    if (st->clock_type == NULL) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, "ClockCore", (PyObject *)st->clock_type) < 0) {
        return -1;
    }
    PyObject *orjson = PyImport_ImportModule("orjson");
    if (orjson == NULL) {
        return -1;
    }
    st->dumps = PyObject_GetAttrString(orjson, "dumps");
    st->option = PyObject_GetAttrString(orjson, "OPT_APPEND_NEWLINE");
    st->encode_error = PyObject_GetAttrString(orjson, "JSONEncodeError");
    Py_DECREF(orjson);
    if (st->dumps == NULL || st->option == NULL || st->encode_error == NULL) {
        return -1;
    }
    /* Interned: orjson matches keyword names by identity first. */
    PyObject *name = PyUnicode_InternFromString("option");
    if (name == NULL) {
        return -1;
    }
    st->option_names = PyTuple_Pack(1, name);
    Py_DECREF(name);
    if (st->option_names == NULL) {
        return -1;
    }
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL) {
        return -1;
    }
    st->time_ns = PyObject_GetAttrString(time, "time_ns");
    Py_DECREF(time);
    return st->time_ns == NULL ? -1 : 0;
}

static int
bulk_traverse(PyObject *module, visitproc visit, void *arg)
{
    bulk_state *st = get_state(module);
    Py_VISIT(st->clock_type);
    Py_VISIT(st->dumps);
    Py_VISIT(st->option);
    Py_VISIT(st->option_names);
    Py_VISIT(st->encode_error);
    Py_VISIT(st->time_ns);
    return 0;
}

static int
bulk_clear(PyObject *module)
{
    bulk_state *st = get_state(module);
    Py_CLEAR(st->clock_type);
    Py_CLEAR(st->dumps);
    Py_CLEAR(st->option);
    Py_CLEAR(st->option_names);
    Py_CLEAR(st->encode_error);
    Py_CLEAR(st->time_ns);
    return 0;
}

static void
bulk_free(void *module)
{
    bulk_clear((PyObject *)module);
}

static PyModuleDef_Slot bulk_slots[] = {
    {Py_mod_exec, bulk_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef bulk_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "oncelog._bulk",
    .m_doc = "Stamping and framing of JSON documents for the Publisher, and its clock.",
    .m_size = sizeof(bulk_state),
    .m_methods = bulk_methods,
    .m_slots = bulk_slots,
    .m_traverse = bulk_traverse,
    .m_clear = bulk_clear,
    .m_free = bulk_free,
};

PyMODINIT_FUNC
PyInit__bulk(void)
{
    return PyModuleDef_Init(&bulk_module);
}
