/* The command-line help: one page per command (usage, flags, an example) and --version. It
 * prints text only: no file is opened, no MPI call is made, no model code is reached. */
#include "help.h"

#include <string.h>

#include "core/backend.h"
#include "core/build_info.h"

typedef struct tz_help_page {
    const char *name, *summary, *usage, *flags, *example;
} tz_help_page;

#define SET_FLAG "  --set section.key=value  override one configuration key (repeatable); see\n" \
                 "                           inputs/reference.cfg for every key\n"

static const tz_help_page pages[] = {
    {"train", "train as configured (Llama or DiT; LoRA, full or qzo), writes run.dir",
     "turbozero train CONFIG [--set section.key=value ...]",
     SET_FLAG
     "Writes run.dir: config.used.cfg, metrics.jsonl, run.json, the adapter or model,\n"
     "checkpoints. Launch several ranks with mpirun or srun (one rank per GPU).\n",
     "mpirun -n 2 turbozero train inputs/llama/finetune.cfg --set run.dir=runs/a"},
    {"eval", "mean validation loss and perplexity of model.path (+ model.adapter)",
     "turbozero eval CONFIG [--set section.key=value ...]",
     SET_FLAG
     "Last line: eval_loss=<float> tokens=<int> (Llama) or eval_loss=<float> images=<int>\n"
     "(DiT). train.eval_windows limits the windows (Llama) or images (DiT), 0 = all.\n",
     "turbozero eval inputs/llama/finetune.cfg --set model.adapter=runs/a/adapter"},
    {"bench", "time train.steps training steps; no evaluation, no output files",
     "turbozero bench CONFIG [--set section.key=value ...]",
     SET_FLAG
     "Prints step time, tokens/s (images/s for DiT), host shard and activation memory, peak RSS.\n",
     "turbozero bench inputs/llama/finetune.cfg --set train.steps=5"},
    {"sample", "a PNG grid of images of one class from a DiT (+ model.adapter)",
     "turbozero sample CONFIG --out grid.png [--class C] [--n N] [--steps S] [--guidance W]\n"
     "                 [--seed S] [--scale K] [--set section.key=value ...]",
     "  --out FILE.png   the grid to write (required)\n"
     "  --class C        the class label (default 0)\n"
     "  --n N            images, 1..4096 (default 16)\n"
     "  --steps S        sampler steps, 1..1000 (default 50)\n"
     "  --guidance W     classifier-free guidance weight (default 4.0)\n"
     "  --seed S         noise seed (default 0)\n"
     "  --scale K        enlarge every pixel to K x K (nearest neighbour), 1..16 (default 1)\n"
     SET_FLAG,
     "turbozero sample inputs/dit/finetune.cfg --class 7 --n 16 --steps 50 --guidance 4 "
     "--scale 4 --out grid.png"},
    {"init-model", "a randomly initialised Llama (HF layout) or DiT",
     "turbozero init-model --arch llama --preset tiny|mini|small --vocab V --out DIR\n"
     "                     [--seed S] [--tied 0|1] [--force]\n"
     "turbozero init-model --arch dit --preset tiny|small --out DIR [--seed S]\n"
     "                     [--objective ddpm|flow] [--force]",
     "  --arch llama|dit     the model family\n"
     "  --preset NAME        the size (docs/guide.md lists the presets)\n"
     "  --out DIR            the folder to write (config.json, model.safetensors); an\n"
     "                       existing file or non-empty folder is refused\n"
     "  --force              write into an existing --out\n"
     "  --seed S             initialisation seed (default 0)\n"
     "  --vocab V            Llama: vocabulary size (required)\n"
     "  --tied 0|1           Llama: tie the input and output embeddings\n"
     "  --objective ddpm|flow  DiT: training objective (default ddpm)\n",
     "turbozero init-model --arch llama --preset tiny --vocab 256 --out models/tiny"},
    {"prep", "a text file to a byte-level token file (prep text)",
     "turbozero prep text --tokenizer bytes --in TEXT --out FILE [--val-fraction F]\n"
     "                    [--val-out FILE2]",
     "  --tokenizer bytes   the only built-in tokenizer: one token per byte (V = 256)\n"
     "  --in TEXT           the text to read\n"
     "  --out FILE          the training token file\n"
     "  --val-fraction F    hold out the last fraction F in [0, 1) for validation\n"
     "  --val-out FILE2     where the held-out tokens go (default FILE with .val before the\n"
     "                      extension)\n",
     "turbozero prep text --tokenizer bytes --in notes.txt --out data/notes.tok "
     "--val-fraction 0.05"},
    {"quantize", "quantize the projections of every transformer block of a Llama folder",
     "turbozero quantize --model DIR --bits B --out DIR2 [--group G] [--method M] [--seed S]\n"
     "                   [--force]",
     "  --model DIR        the HF-layout model to read\n"
     "  --bits B           2, 3 or 4 bits per weight\n"
     "  --out DIR2         the quantized model folder to write; an existing file or\n"
     "                     non-empty folder is refused, DIR itself or a folder inside it always\n"
     "  --force            write into an existing --out (never into --model)\n"
     "  --group G          64, 128 or 256 weights per group (default 128)\n"
     "  --method M         turboquant (default) or absmax\n"
     "  --seed S           the rotation's sign seed (default 0)\n",
     "turbozero quantize --model inputs/llama/model --bits 4 --out models/q4"},
    {"export", "a quantized model back as a plain HF-layout model, every tensor F32",
     "turbozero export --model DIR2 --dequantize --out DIR3 [--force]",
     "  --model DIR2     the (quantized) model folder to read\n"
     "  --dequantize     decode the quantized tensors (the only export there is)\n"
     "  --out DIR3       the folder to write; an existing file or non-empty folder is\n"
     "                   refused, DIR2 itself or a folder inside it always\n"
     "  --force          write into an existing --out (never into --model)\n",
     "turbozero export --model models/q4 --dequantize --out models/q4-f32"},
    {"plot", "train and eval loss against steps of one or more runs, as a PNG",
     "turbozero plot RUN_DIR [RUN_DIR ...] --out curve.png",
     "  RUN_DIR          a run.dir with a metrics.jsonl (finished or still running)\n"
     "  --out FILE.png   the picture to write: one colour per run, the training loss as a\n"
     "                   line, the evaluation loss as squares\n",
     "turbozero plot runs/a runs/b --out curves.png"},
    {"help", "this summary, or one command's page",
     "turbozero help [COMMAND]   (or turbozero COMMAND --help)", "", "turbozero help train"},
};
#define NPAGES ((int)(sizeof pages / sizeof pages[0]))

void tz_help_print_summary(FILE *f) {
    fprintf(f,
            "turbozero %s: fine-tune Llama language models and DiT diffusion transformers\n"
            "with TurboQuant 2-4-bit base weights, LoRA or full training, and ZeRO-2 over MPI\n"
            "usage: turbozero <command> [args]   (turbozero <command> --help for its flags)\n",
            tz_build_version());
    for (int i = 0; i < NPAGES; i++) fprintf(f, "  %-11s %s\n", pages[i].name, pages[i].summary);
    fprintf(f, "  --version   the version and the build\n"
               "See docs/guide.md and inputs/reference.cfg.\n");
}

int tz_help_print_command(const char *cmd) {
    for (int i = 0; i < NPAGES; i++) {
        const tz_help_page *p = &pages[i];
        if (strcmp(cmd, p->name)) continue;
        printf("turbozero %s: %s\nusage: %s\n", p->name, p->summary, p->usage);
        if (*p->flags) printf("\n%s", p->flags);
        printf("\nexample:\n  %s\n", p->example);
        return 0;
    }
    return -1;
}

int tz_help_wanted(int argc, char **argv, int from) {
    for (int i = from; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}

void tz_help_print_version(void) {
    printf("turbozero %s\nbuild: commit %s, CUDA %s, CPU kernel %s\n", tz_build_version(),
           tz_build_commit(), tz_build_has_cuda() ? "yes" : "no", tz_cpu_kernel_name());
}
