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
 * The UUID layout is oncelog.message's (Gazette's): time_low-time_mid-time_hi(version 1)-
 * clock sequence (variant, 4-bit sequence counter, 10 flag bits)-node (the producer). The
 * module holds no state (multi-phase initialisation, no globals).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define UUID_TEXT 36
#define PRODUCER_LEN 6
#define FLAGS_MASK 0x3FF

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

static PyMethodDef bulk_methods[] = {
    {"frame_json", (PyCFunction)(void (*)(void))bulk_frame_json, METH_FASTCALL,
     "frame_json(docs, key, key_json, producer, first_clock, flags, dumps, /)\n--\n\n"
     "JSON-lines frames of `docs`, stamped with consecutive clocks from `first_clock`; "
     "None if the encoding cannot be cut (take the pure path)."},
    {"format_uuid", (PyCFunction)(void (*)(void))bulk_format_uuid, METH_FASTCALL,
     "format_uuid(producer, clock, flags, /)\n--\n\n"
     "The canonical text of the message UUID of (producer, clock, flags)."},
    {NULL, NULL, 0, NULL},
};

static int
bulk_exec(PyObject *module)
{
    return PyModule_AddIntConstant(module, "UUID_TEXT_LEN", UUID_TEXT);
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
    .m_doc = "Bulk stamping and framing of JSON documents for Publisher.publish_many.",
    .m_size = 0,
    .m_methods = bulk_methods,
    .m_slots = bulk_slots,
};

PyMODINIT_FUNC
PyInit__bulk(void)
{
    return PyModuleDef_Init(&bulk_module);
}
