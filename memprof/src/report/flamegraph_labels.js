// memprof: the flamegraph's labels (replaces inferno's update_text and
// update_text_for_elements, which cut a long name to its last characters,
// `..ialize`). A name that does not fit its box is shown by its most
// telling part, the first of these that fits:
//   Hash(BasicBlock, Int32)#[]=          the name
//   -> proc at fiber.cr:98               directories left out of paths
//   Hash#[]=                             type and parameter lists left out
//   #[]=                                 the method alone (`#m`, `.m`, `ns::m` -> `m`)
//   #[..                                 that, cut at its end
// The full name stays in the box's tooltip and in the line under the graph.
function memprof_label_candidates(name) {
    var out = [name];
    var add = function(s) {
        if (s && out.indexOf(s) < 0) out.push(s);
    };
    // Directories of source paths (`-> proc at /usr/lib/crystal/lib/fiber.cr:98`).
    var text = name.replace(/(^|[\s(])\/(?:[^\/\s]*\/)+/g, "$1");
    add(text);
    // Bracketed lists right after a name (`Array(Foo)`, `vector<int>`,
    // `f(int)`), innermost first; a list after a space (`x (init)`) stays.
    var bare = text, prev;
    do {
        prev = bare;
        bare = bare.replace(/([\w\]>)?!])(\([^()]*\)|<[^<>]*>)/g, "$1");
    } while (bare !== prev);
    add(bare);
    // The method: what follows the last `#`, `.` or `::` of the first word.
    var space = bare.indexOf(" ");
    var word = space < 0 ? bare : bare.substring(0, space);
    var rest = space < 0 ? "" : bare.substring(space);
    if (word.indexOf("+0x") < 0 && word.charAt(0) !== "[") {
        var m = /^(.*?)(#|\.|::)((?:[^#.:]|:(?!:))+)$/.exec(word);
        if (m && m[1] && m[3]) add((m[2] === "::" ? "" : m[2]) + m[3] + rest);
    }
    return out;
}
function memprof_label(name, width, measure) {
    var candidates = memprof_label_candidates(name);
    for (var i = 0; i < candidates.length; i++) {
        if (measure(candidates[i]) <= width) return candidates[i];
    }
    var last = candidates[candidates.length - 1];
    for (var n = last.length - 1; n >= 3; n--) {
        var cut = last.substring(0, n) + "..";
        if (measure(cut) <= width) return cut;
    }
    return "";
}
function memprof_frame_label(e) {
    var r = find_child(e, "rect");
    var t = find_child(e, "text");
    var w = parseFloat(r.attributes.width.value) * frames.attributes.width.value / 100 - 3;
    var name = find_child(e, "title").textContent.replace(/ \([^(]*\)$/, "");
    var x = format_percent(parseFloat(r.attributes.x.value) + (100 * 3 / frames.attributes.width.value));
    if (w < 2 * (known_font_width || fontsize * fontwidth)) return [x, ""];
    var measure = known_font_width > 0
        ? function(s) { return s.length * known_font_width; }
        : function(s) { t.textContent = s; return t.getComputedTextLength(); };
    return [x, memprof_label(name, w, measure)];
}
function update_text(e) {
    var label = memprof_frame_label(e);
    var t = find_child(e, "text");
    t.attributes.x.value = label[0];
    t.textContent = label[1];
}
function update_text_for_elements(elements) {
    // Read everything first, then write (no layout between the reads).
    var labels = [];
    for (var i = 0; i < elements.length; i++) labels.push(memprof_frame_label(elements[i]));
    for (var i = 0; i < elements.length; i++) {
        var t = find_child(elements[i], "text");
        t.attributes.x.value = labels[i][0];
        t.textContent = labels[i][1];
    }
}
